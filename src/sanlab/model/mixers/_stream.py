"""What `rnd_emb_qk` and `fixed_seq_qk` share (SPEC §3 RndEmbQK / FixedSeqQK): Q and K
from the hidden states of a fixed input sequence passed through the layers."""

from __future__ import annotations

from sanlab.configbase import StrictModel
from sanlab.model.mixers.softmax import SoftmaxSpec


class StreamOptions(StrictModel):
    seed: int = 0  # the fixed input sequence is drawn from this seed


class StreamQKSpec(SoftmaxSpec):
    """Same parameters as softmax attention; the fixed pass is one extra row per step
    (not in the per-token FLOP terms)."""

    Options = StreamOptions


# ---- the module
import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.attention import AttentionContext, build_context
from sanlab.model.layers import HookPoint
from sanlab.model.mixers.softmax import SoftmaxAttention


class StreamQK(SoftmaxAttention):
    """`prepare` first runs the blocks on the fixed sequence (one row, positions
    0…T−1, as a plain model: there each such layer's Q and K come from its own input)
    and records each layer's normalised input; the real batch then reads Q and K of the
    token at document position p from the fixed stream at position p (so a packed row
    gives each document what it would get alone), V from its own hidden state. The
    fixed pass is trained through."""

    decode_cache = None  # Q and K from the fixed stream: the softmax KV cache does not apply

    @staticmethod
    def prepare(model: nn.Module, ctx: AttentionContext) -> None:
        seg = ctx.segment_ids
        ctx.mixer_state["qk_stream"] = fixed_stream(model, seg.shape[1], seg.device)

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        stream = ctx.mixer_state.get("qk_stream")
        if stream is None:  # the fixed pass itself: record this layer's input
            ctx.mixer_state.setdefault("qk_record", {})[self.layer_idx] = u
            return u
        fixed = stream[self.layer_idx]  # (1, T, d)
        return fixed[0][ctx.positions].to(u.dtype)  # (B, T, d), by position within the document

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        """The fixed sequence's input to block 0, (1, T, d)."""
        raise NotImplementedError


def fixed_stream(model: nn.Module, T: int, device: torch.device) -> dict[int, torch.Tensor]:
    """Run the blocks of `model` (an `LM`) on the fixed sequence of its first stream-QK
    layer (one row of T tokens, one document) and return each such layer's normalised
    input, (1, T, d) by layer index."""
    first = next(b.attn for b in model.blocks if isinstance(b.attn, StreamQK))
    x = first.fixed_input(model.embed, model.embed_scale, T, model.cfg, device)
    ctx = build_context(model.cfg, torch.zeros(1, T, dtype=torch.long, device=device), None)
    ctx.embedded = x
    # the fixed pass is not what analysis captures: its hook points stay silent
    muted = [(m, dict(m._forward_hooks)) for m in model.modules() if isinstance(m, HookPoint) and m.active]
    for m, _ in muted:
        m._forward_hooks.clear()
    try:
        for block in model.blocks:
            x = block(x, ctx)
    finally:
        for m, hooks in muted:
            m._forward_hooks.update(hooks)
    return dict(ctx.mixer_state.get("qk_record", {}))
