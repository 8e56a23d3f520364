"""`mlp`: attention replaced by a token-local gated MLP with the attention's parameter
count (SPEC §3 MLP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.spec import Param, SequenceSpec, matrix_flops
from sanlab.model.mixers.swiglu import swiglu_params

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry


class MLPOptions(StrictModel):
    d_hidden: int | None = Field(None, gt=0)


@register_mixer
class MLPSpec(SequenceSpec):
    """O = W_dn(SiLU(W_gt u) ⊙ W_up u), hidden width (W_q + W_k + W_v + W_o weights) / (3·d)
    (= d under 8:4 GQA; `d_hidden` overrides). No cross-token interaction at all (so no
    pattern)."""

    name = "mlp"
    short = "mlp"
    summary = "token-local gated MLP with the attention's parameter count"
    paper = "SPEC §3"
    Options = MLPOptions
    freezable = {"mlp": ("w_gate.weight", "w_up.weight", "w_down.weight")}

    @staticmethod
    def hidden(cfg: ModelConfig, opts: Any) -> int:
        if opts.d_hidden is not None:
            return opts.d_hidden
        d, dh = cfg.d_model, cfg.head_dim
        attn = 2 * d * cfg.n_heads * dh + 2 * d * cfg.n_kv_heads * dh
        return max(1, attn // (3 * d))

    @classmethod
    def params(cls, cfg: ModelConfig, opts: Any) -> dict[str, Param]:
        return swiglu_params(cfg.d_model, cls.hidden(cfg, opts))

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"attn_proj": matrix_flops(cls.params(cfg, opts))}


# ---- the module
import torch

from sanlab.model.attention import AttentionContext
from sanlab.model.mixers.base import SequenceMixer
from sanlab.model.mixers.swiglu import swiglu


class MLPMixer(SequenceMixer):
    spec = MLPSpec

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return swiglu(self, u)
