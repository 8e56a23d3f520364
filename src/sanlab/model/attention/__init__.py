"""Attention, owned here: the per-batch context and its masks, the one place that picks a
backend, and the kernels.

- `context`: `AttentionContext` (RoPE tables, document positions, backend, masks built on
  first use and cached), `build_context`;
- `masks`: `Mask`, which keys a query sees (`DOCUMENT`, `Window`, a mixer's own: one
  definition), in the forms the kernels and the decode cache take;
- `dispatch`: `resolve_backend` (a batch's backend), `attend` and `fused_qkv_attention`
  (run it, routing what the fused kernel does not take), `attention_kernel` (what a run
  records);
- `explicit`: the explicit PyTorch kernel and `attention_reference`, the formula every
  kernel is tested against;
- `fused`: the compiled CPU kernel as torch custom ops (`sanlab::fused_attention`,
  `sanlab::qkv_attention`).

Mixers call `attend(q, k, v, ctx, mask=...)` (or `fused_qkv_attention` from a QKV product)
and never branch on the backend.
"""

from sanlab.model.attention.context import AttentionContext, build_context
from sanlab.model.attention.dispatch import attend, attention_kernel, fused_qkv_attention, resolve_backend
from sanlab.model.attention.explicit import attention_reference
from sanlab.model.attention.masks import DOCUMENT, Mask, Window, segment_positions

__all__ = ["DOCUMENT", "AttentionContext", "Mask", "Window", "attend", "attention_kernel", "attention_reference",
           "build_context", "fused_qkv_attention", "resolve_backend", "segment_positions"]
