"""`swiglu`: the gated MLP W_down(SiLU(W_gate x) ⊙ W_up x), no biases: the state mixer
(FFN) of the standard arm (SPEC §1.1), also the `mlp` sequence mixer's computation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sanlab.model.mixers import register_state_mixer
from sanlab.model.mixers.spec import Param, StateSpec, matrix_flops

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry


def swiglu_params(d: int, hidden: int) -> dict[str, Param]:
    """W_gate, W_up (d -> hidden) and W_down (hidden -> d), in the order of SPEC §1.1's draws."""
    return {"w_gate.weight": Param((hidden, d), "content", "normal"),
            "w_up.weight": Param((hidden, d), "content", "normal"),
            "w_down.weight": Param((d, hidden), "content", "out")}  # writes into the residual stream


@register_state_mixer
class SwiGLUSpec(StateSpec):
    """W_down(SiLU(W_gate x) ⊙ W_up x) of width `cfg.ffn_dim` (`model.d_ff`, 4·d by default)."""

    name = "swiglu"
    summary = "W_down(SiLU(W_gate x) ⊙ W_up x), width `d_ff` (the standard arm's FFN)"
    paper = "SPEC §1.1"
    freezable = {"mlp": ("w_gate.weight", "w_up.weight", "w_down.weight")}
    probe_freeze = {"mlp": "Frozen-MLP"}  # SPEC §2: the FFN's matrices at their init

    @classmethod
    def params(cls, cfg: ModelConfig, opts: Any) -> dict[str, Param]:
        return swiglu_params(cfg.d_model, cfg.ffn_dim)

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"ffn": matrix_flops(cls.params(cfg, opts))}


# ---- the module
import torch
import torch.nn.functional as F
from torch import nn

from sanlab.model.kernels import silu_gate
from sanlab.model.mixers.base import StateMixer


def swiglu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """W_down(SiLU(W_gate x) ⊙ W_up x) with `m`'s w_gate, w_up, w_down."""
    # gate and up as one product: x is read and cast once, dL/dx is one matmul
    gate_up = F.linear(x, torch.cat([m.w_gate.weight, m.w_up.weight]))
    return m.w_down(silu_gate(gate_up))


class SwiGLU(StateMixer):
    spec = SwiGLUSpec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(self, x)
