"""A block is a sequence mixer plus an optional state mixer (FFN).

Attention-only (the SAN) means `ffn=False`: the same class without its FFN, not a
second code path (DESIGN.md rule 2). Pre-norm; each sublayer's update enters the
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
from sanlab.model.kernels import gated_residual
from sanlab.model.layers import AttentionContext, HookPoint, SwiGLU, make_norm
from sanlab.model.mixers import build_mixer

STATE_MIXERS: dict[str, type[nn.Module]] = {"swiglu": SwiGLU}


def residual_scalar(mode: str) -> nn.Parameter | None:
    """The per-sublayer scalar of the residual rule, if it has one."""
    return nn.Parameter(torch.zeros(1)) if mode in ("gated", "rezero") else None


def residual_update(mode: str, x: torch.Tensor, h: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    if mode == "gated":
        return gated_residual(x, h, g)
    if mode == "rezero":
        return x + g.to(h.dtype) * h
    if mode == "standard":
        return x + h
    return h


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
