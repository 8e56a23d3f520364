"""A block is a sequence mixer plus an optional state mixer (FFN).

Attention-only (the SAN) means `state_mixer="none"` (`ffn=false`): the same class without
its FFN, not a second code path (docs/architecture.md, design rules). The sequence mixer of layer i is
`cfg.layer_mixers[i]` (the layout); its module is always `attn` and the state mixer's
`ffn`, so parameter and hook names are stable across variants. Pre-norm; each sublayer's update enters the
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
from sanlab.model.attention import AttentionContext
from sanlab.model.kernels import gated_residual
from sanlab.model.layers import HookPoint, make_norm
from sanlab.model.mixers import build_mixer, build_state_mixer
from sanlab.model.mixers.spec import Role


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
            self.ffn_norm = make_norm(cfg, cfg.d_model, feeds_matmul=True)
            self.ffn = build_state_mixer(cfg, layer_idx)
            self.ffn_post_norm = make_norm(cfg, cfg.d_model) if cfg.sandwich_norm else None
            self.ffn_out = HookPoint()
            self.ffn_gate = residual_scalar(cfg.residual)
        else:
            self.ffn = None
        self.resid_post = HookPoint()

    def param_roles(self) -> dict[str, Role]:
        """Role of every parameter of the block, by name relative to the block."""
        roles: dict[str, Role] = {}
        for sub in ("attn", "ffn"):
            mixer = getattr(self, sub)
            if mixer is None:
                continue
            roles |= {f"{sub}.{k}": r for k, r in mixer.param_roles().items()}
            for norm in (f"{sub}_norm", f"{sub}_post_norm"):
                if getattr(self, norm) is not None:
                    roles[f"{norm}.weight"] = "gain"
            if getattr(self, f"{sub}_gate") is not None:
                roles[f"{sub}_gate"] = "gate"
        return roles

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Norm gains to their identity, residual scalars to 0, then each mixer's own init
        (the sequence mixer first: the draw order of SPEC §1.1's init is W_q W_k W_v W_o,
        then W_gate W_up W_down)."""
        for sub in ("attn", "ffn"):
            mixer = getattr(self, sub)
            if mixer is None:
                continue
            for norm in (f"{sub}_norm", f"{sub}_post_norm"):
                if getattr(self, norm) is not None:
                    getattr(self, norm).reset_parameters()
            if getattr(self, f"{sub}_gate") is not None:
                getattr(self, f"{sub}_gate").zero_()
            mixer.reset_parameters(std, out_std)

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
