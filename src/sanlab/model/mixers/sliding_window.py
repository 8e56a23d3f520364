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


# ---- the module (from the `import torch` on, loaded when a model is built)
import torch  # noqa: F401 - the line where the module part starts

from sanlab.model.attention import Mask, Window
from sanlab.model.mixers.softmax import SoftmaxAttention


class SlidingWindowAttention(SoftmaxAttention):
    """Softmax attention under the mask `Window(window)`. Every backend takes it: the fused
    CPU kernel as each row's first key (no (T, T) mask), the others as a mask; the softmax
    KV cache it inherits decodes under it."""

    spec = SlidingWindowSpec
    one_op_qkv = False  # norm_rope then attend, as its runs so far computed it (bit for bit)

    def attention_mask(self) -> Mask:
        return Window(self.opts.window)
