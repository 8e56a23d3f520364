"""`sink_window`: softmax attention in which each token sees the first `sinks` tokens of its
document (attention sinks) and the last `window` tokens, itself included
(`model.mixer_options.sinks`, `.window`).

docs/variants.md's second worked example, a variant with a mask of its own: this file
(the mask, the spec, the module), and its test tests/test_sink_window.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.softmax import SoftmaxSpec


class SinkWindowOptions(StrictModel):
    sinks: int = Field(4, ge=0, description="the first tokens of its document every token sees (attention sinks)")
    window: int = Field(128, ge=1, description="the last keys a token sees: itself and the window − 1 tokens before it")


@register_mixer
class SinkWindowSpec(SoftmaxSpec):
    """Softmax attention's parameters, roles, init, freeze targets and FLOP terms (attention
    is counted as the full square whatever its mask, as FlopCounterMode counts it); query i
    sees key j of its document (j ≤ i) when j is among its first `sinks` tokens or
    i − j < window."""

    name = "sink_window"
    short = "sinkwin"
    paper = ""  # not a paper's variant (StreamingLLM's sinks, inside each document)
    summary = ("softmax attention in which each token sees the first `sinks` tokens of its document and its "
               "last `window` tokens, itself included")
    Options = SinkWindowOptions


# ---- the module (from the `import torch` on, loaded when a model is built)
import torch

from sanlab.model.attention import Mask
from sanlab.model.mixers.softmax import SoftmaxAttention


@dataclass(frozen=True)
class SinksAndWindow(Mask):
    """Key j for query i (same document, j ≤ i) when j is one of the document's first
    `sinks` tokens or one of the last `window` (i − j < window). Two key intervals per row
    once the window has moved past the sinks, so no interval form (the fused CPU kernel's)
    unless `sinks` is 0; every other backend and the KV cache take it as it is."""

    sinks: int
    window: int

    def allows(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return (k_pos < self.sinks) | (k > q - self.window)

    def first_key(self, q_pos: torch.Tensor) -> torch.Tensor | None:
        return (q_pos - self.window + 1).clamp_min(0) if self.sinks == 0 else None


class SinkWindowAttention(SoftmaxAttention):
    """Softmax attention under `SinksAndWindow`: the forward pass, every backend and the
    KV cache (decoding) are softmax attention's, which read the mask."""

    spec = SinkWindowSpec

    def attention_mask(self) -> Mask:
        return SinksAndWindow(self.opts.sinks, self.opts.window)
