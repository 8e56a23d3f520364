"""Sequence mixers, registered by name (`model.mixer`).

A sequence mixer maps the normalised residual stream u (B, T, d) to an update
(B, T, d) using an `AttentionContext`. A new attention variant is a new class
registered here, not another flag on an existing one (DESIGN.md rule 1).

Every mixer exposes `output_weights()`: the matrices written into the residual
stream, which get the depth-scaled init std / sqrt(2 · n_layers) (SPEC §1.1).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.layers import AttentionContext, HookPoint, RMSNorm, apply_rope, attend, make_norm, upcast

MIXERS: dict[str, type[nn.Module]] = {}


def register_mixer(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        if name in MIXERS:
            raise ValueError(f"sequence mixer {name!r} registered twice")
        MIXERS[name] = cls
        return cls

    return wrap


def build_mixer(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    from sanlab.errors import ConfigError

    cls = MIXERS.get(cfg.mixer)
    if cls is None:
        raise ConfigError(f"model.mixer: unknown sequence mixer {cfg.mixer!r} (known: {', '.join(MIXERS)})")
    return cls(cfg, layer_idx)


@register_mixer("softmax")
class SoftmaxAttention(nn.Module):
    """Grouped-query softmax attention with per-head QK-norm then RoPE (SPEC §1.1).

    q, k = RoPE(ZCN_h(W_q u)), RoPE(ZCN_h(W_k u)); one gain vector of size head_dim
    per q and per k, shared by all heads; A = softmax(q kᵀ/√d_h + M); out = W_o(A v).
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.wq = nn.Linear(d, H * D, bias=False)
        self.wk = nn.Linear(d, Hkv * D, bias=False)
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        self.q_norm = make_norm(cfg, D) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, D) if cfg.qk_norm else None
        self.pattern = HookPoint()

    def output_weights(self) -> list[nn.Parameter]:
        return [self.wo.weight]

    @staticmethod
    def _norm_rope(x: torch.Tensor, norm: RMSNorm | None, ctx: AttentionContext) -> torch.Tensor:
        """Per-head QK-norm THEN RoPE, both in fp32. (B, T, h, D). The explicit kernel
        computes its scores in fp32, so it gets q and k unrounded; SDPA and FlexAttention
        need them in v's dtype, which `attend` casts to."""
        x32 = upcast(x)
        if norm is not None:
            x32 = norm.normalize(x32)
        return apply_rope(x32, ctx.cos, ctx.sin)

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        # One product for Q, K and V (three parameters, so Muon still sees each matrix):
        # u is read and cast once, and dL/du is a single fp32-accumulated matmul.
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        q, k = self._norm_rope(q, self.q_norm, ctx), self._norm_rope(k, self.k_norm, ctx)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), ctx, self.pattern)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
