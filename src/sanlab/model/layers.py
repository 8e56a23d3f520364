"""Building blocks: ZCN / RMS norm, RoPE tables, hook points.

The hand-written kernels these call live in `sanlab.model.norms` and
`sanlab.model.kernels`, each beside its reference formula; attention (its context, masks
and kernels) in `sanlab.model.attention`. Everything here is single-device and has no
knowledge of the config file format beyond `ModelConfig`.
"""

from __future__ import annotations

import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.kernels import rope, upcast
from sanlab.model.norms import rms_norm


class HookPoint(nn.Module):
    """Identity module marking a tensor that analysis may capture.

    Its module path is its stable name (`blocks.3.attn.pattern`). Forward hooks
    registered on it see the tensor; with no hooks it costs a function call.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks)


class RMSNorm(nn.Module):
    """RMS norm computed in fp32.

    zero_centered=True is the paper's ZCN: (1 + γ) ⊙ z / RMS(z) with γ initialised
    to 0, so the parameter's origin is the identity scale (SPEC §1.1).
    zero_centered=False is plain RMS norm with γ initialised to 1; with the gains
    undecayed the two differ by a constant shift (the noise-floor pair of SPEC §1.4).
    """

    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = True, feeds_matmul: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        # A norm whose only reader is a matmul writes its result in the autocast dtype
        # directly (the matmul would cast it anyway): one pass over the activations less
        # each way. Computed in fp32 all the same.
        self.feeds_matmul = feeds_matmul
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """γ = 0 for ZCN (the identity scale), 1 for plain RMS norm."""
        self.weight.fill_(0.0 if self.zero_centered else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        cast = self.feeds_matmul and torch.is_autocast_enabled(dev)
        return self.normalize(upcast(x), torch.get_autocast_dtype(dev) if cast else x.dtype)

    def gain(self, dtype: torch.dtype) -> torch.Tensor:
        """The scale the norm multiplies by, in `dtype`: 1 + γ for ZCN, γ otherwise."""
        gain = self.weight.to(dtype)
        return 1.0 + gain if self.zero_centered else gain

    def normalize(self, x32: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The norm on an already-upcast tensor, result in `out_dtype` (default x32's)."""
        return rms_norm(x32, self.gain(x32.dtype), self.eps, out_dtype or x32.dtype)


def make_norm(cfg: ModelConfig, dim: int, feeds_matmul: bool = False) -> RMSNorm:
    return RMSNorm(dim, cfg.norm_eps, zero_centered=cfg.norm == "zcrms", feeds_matmul=feeds_matmul)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotate-half RoPE at integer `positions` (B, T) -> (B, T, 1, D)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, D)
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, x·cos + rotate_half(x)·sin. x: (B, T, H, D); cos/sin: (B, T, 1, D)
    from `rope_tables` (both halves equal). Computed in fp32, returned in x's dtype."""
    half = x.shape[-1] // 2
    return rope(upcast(x), cos[..., :half], sin[..., :half]).to(x.dtype)
