"""`static_emb_qk`: Q and K from the static input token embeddings (SPEC §3 StaticEmbQK)."""

from __future__ import annotations

from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.softmax import SoftmaxSpec


@register_mixer
class StaticEmbQKSpec(SoftmaxSpec):
    """Q and K from the scaled embedding entering block 0, RMS-normalised without a gain,
    instead of the current hidden state; V from the current hidden state. Same
    parameters as softmax attention."""

    name = "static_emb_qk"
    short = "staticqk"
    summary = "Q/K from the static input embeddings, V from the hidden state"
    paper = "SPEC §3"


# ---- the module
import torch

from sanlab.model.attention import AttentionContext
from sanlab.model.layers import upcast
from sanlab.model.mixers.softmax import SoftmaxAttention


def static_qk_input(ctx: AttentionContext, dtype: torch.dtype) -> torch.Tensor:
    """The input embedding RMS-normalised (no gain), in `dtype`, once per batch and dtype."""
    cache = ctx.mixer_state.setdefault("static_qk", {})
    if dtype not in cache:
        x = upcast(ctx.embedded)
        cache[dtype] = (x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(dtype)
    return cache[dtype]


class StaticEmbQK(SoftmaxAttention):
    spec = StaticEmbQKSpec
    decode_cache = None  # Q and K from the embeddings: the softmax KV cache does not apply

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.embedded is None:
            raise RuntimeError("static_emb_qk needs the input embeddings in the attention context")
        return static_qk_input(ctx, u.dtype)
