"""A block is a sequence mixer plus an optional state mixer (FFN).

Attention-only (the SAN) means `ffn=False`: the same class without its FFN, not a
second code path (docs/architecture.md, design rules). Pre-norm; each sublayer's update enters the
residual stream through the configured residual rule (SPEC §1.1):

    gated     x + σ(g) · f(x)     g scalar, init 0 (σ(0) = 1/2)   [default]
    rezero    x + α · f(x)        α scalar, init 0
    standard  x + f(x)
    none      f(x)
"""

from __future__ import annotations

import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError
from sanlab.model.layers import AttentionContext, HookPoint, SwiGLU, make_norm
from sanlab.model.mixers import build_mixer

STATE_MIXERS: dict[str, type[nn.Module]] = {"swiglu": SwiGLU}


def residual_scalar(mode: str) -> nn.Parameter | None:
    """The per-sublayer scalar of the residual rule, if it has one."""
    return nn.Parameter(torch.zeros(1)) if mode in ("gated", "rezero") else None


def residual_update(mode: str, x: torch.Tensor, h: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    if mode == "gated":
        return _GatedResidual.apply(x, h, g)
    if mode == "rezero":
        return x + g.to(h.dtype) * h
    if mode == "standard":
        return x + h
    return h


class _GatedResidual(torch.autograd.Function):
    """x + σ(g)·h in one pass (x the fp32 stream, h a sublayer's update, often bf16), with
    dx = dy, dh = σ(g)·dy, dg = σ'(g)·Σ dy⊙h: two passes, where autograd through the
    cast, the product and the promoting add makes four each way. (With a bf16 h the
    gate's gradient sums bf16 row dot products in fp32; autograd's sums in bf16.)"""

    @staticmethod
    def forward(ctx, x, h, g):  # type: ignore[override]
        s = torch.sigmoid(g)
        ctx.save_for_backward(h, s)
        return torch.addcmul(x, h, s.to(torch.promote_types(x.dtype, h.dtype)))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        h, s = ctx.saved_tensors
        # dh = σ·dy written in h's dtype in one pass; then dg = σ'·⟨dy, h⟩ = (1 − σ)·⟨dh, h⟩
        dh = torch.mul(dy, s, out=torch.empty(h.shape, dtype=h.dtype, device=h.device))
        rows = (-1, h.shape[-1])  # (row-wise: a flat bf16 dot product is ~10x slower on the CPU)
        dg = (1 - s) * torch.linalg.vecdot(dh.reshape(rows), h.reshape(rows)).sum(dtype=s.dtype)
        return dy, dh, dg


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.residual = cfg.residual
        self.resid_pre = HookPoint()
        self.attn_norm = make_norm(cfg, cfg.d_model, feeds_matmul=True)
        self.attn = build_mixer(cfg, layer_idx)
        self.attn_post_norm = make_norm(cfg, cfg.d_model) if cfg.sandwich_norm else None
        self.attn_out = HookPoint()
        self.attn_gate = residual_scalar(cfg.residual)
        self.resid_mid = HookPoint()
        if cfg.ffn:
            if cfg.ffn_type not in STATE_MIXERS:
                raise ConfigError(
                    f"model.ffn_type: unknown state mixer {cfg.ffn_type!r} (known: {', '.join(STATE_MIXERS)})"
                )
            self.ffn_norm = make_norm(cfg, cfg.d_model, feeds_matmul=True)
            self.ffn = STATE_MIXERS[cfg.ffn_type](cfg.d_model, cfg.ffn_dim)
            self.ffn_post_norm = make_norm(cfg, cfg.d_model) if cfg.sandwich_norm else None
            self.ffn_out = HookPoint()
            self.ffn_gate = residual_scalar(cfg.residual)
        else:
            self.ffn = None
        self.resid_post = HookPoint()

    def output_weights(self) -> list[nn.Parameter]:
        out = list(self.attn.output_weights())
        if self.ffn is not None:
            out += self.ffn.output_weights()
        return out

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = self.resid_pre(x)
        h = self.attn(self.attn_norm(x), ctx)
        if self.attn_post_norm is not None:
            h = self.attn_post_norm(h)
        x = self.resid_mid(residual_update(self.residual, x, self.attn_out(h), self.attn_gate))
        if self.ffn is not None:
            h = self.ffn(self.ffn_norm(x))
            if self.ffn_post_norm is not None:
                h = self.ffn_post_norm(h)
            x = residual_update(self.residual, x, self.ffn_out(h), self.ffn_gate)
        return self.resid_post(x)
