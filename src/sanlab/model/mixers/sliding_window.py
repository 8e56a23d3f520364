"""`sliding_window`: softmax attention in which each token sees only the last `window`
tokens of its document, itself included (`model.mixer_options.window`).

docs/variants.md's worked example of a variant: this file, and its test
tests/test_sliding_window.py.
"""

from __future__ import annotations

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.softmax import SoftmaxSpec


class SlidingWindowOptions(StrictModel):
    window: int = Field(128, ge=1, description="keys a token sees: itself and the window − 1 tokens before it")


@register_mixer
class SlidingWindowSpec(SoftmaxSpec):
    """Softmax attention's parameters, roles, init, freeze targets and FLOP terms (attention
    is counted as the full square whatever its mask, as FlopCounterMode counts it); query i
    sees key j of its document only when i − j < window."""

    name = "sliding_window"
    short = "swa"
    paper = ""  # not a paper's variant
    summary = "softmax attention in which each token sees only the last `window` tokens of its document, itself included"
    Options = SlidingWindowOptions


# ---- the module
import torch
import torch.nn.functional as F

from sanlab.model.attention import AttentionContext, attend
from sanlab.model.mixers.softmax import SoftmaxAttention


class SlidingWindowAttention(SoftmaxAttention):
    """`attend(..., window=)` takes the window to every backend: to the fused CPU kernel as
    each row's first key (no (T, T) mask), to the others as a mask."""

    spec = SlidingWindowSpec
    decode_cache = None  # the softmax KV cache attends to every cached key, not the last `window`

    def mask_windows(self) -> tuple[int | None, ...]:
        return (self.opts.window,)

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = self._norm_rope(q.view(B, T, H, D), self.q_norm, ctx).transpose(1, 2)  # (B, H, T, D)
        k = self._norm_rope(k.view(B, T, Hkv, D), self.k_norm, ctx).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        y = attend(q, k, v, ctx, self.pattern, window=self.opts.window)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
