"""The masks attention applies, from a batch's segment ids: a token sees only itself and
earlier tokens (causal) of its own document (segment id) and, given a `window`, only the
last `window` of those (itself included: token i sees key j when 0 ≤ i − j < window).
Each in the forms the kernels take: a dense bool mask, an additive one, each row's first
visible key (the fused kernel's: the allowed keys of a row are one interval), a
FlexAttention block mask.
"""

from __future__ import annotations

from typing import Callable

import torch


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its segment (document): restarts at 0. (B, T) -> (B, T)."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    is_start = torch.ones_like(segment_ids, dtype=torch.bool)
    is_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_idx = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


def check_window(window: int | None) -> None:
    """A window is None (the whole document) or a positive int; anything else is a ValueError."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention window: a positive number of keys or None, not {window!r}")


def dense_mask(segment_ids: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """(B, 1, T, T) bool: causal AND same document (AND i − j < window). True = may attend."""
    seg = segment_ids
    T = seg.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=seg.device).tril()
    if window is not None:
        causal = causal.triu(1 - window)  # j ≥ i − window + 1
    same = seg[:, :, None] == seg[:, None, :]
    return (same & causal)[:, None]


def row_starts(segment_ids: torch.Tensor, positions: torch.Tensor, single_document: bool,
               window: int | None = None) -> torch.Tensor | None:
    """(B, T) int32: the first key each query may see, i.e. where its document starts, or
    with a window the later of that and i − window + 1 (the fused kernel's mask: row i
    sees keys [row_starts[i], i]). That describes the dense mask exactly when every
    segment id is one run in its row, as packed rows are (ids rise along the row); None
    otherwise (an id that recurs after another)."""
    seg = segment_ids
    if single_document or bool((seg[:, 1:] >= seg[:, :-1]).all()):
        T = seg.shape[1]
        idx = torch.arange(T, device=seg.device)
        first = idx - positions
        if window is not None:
            first = torch.maximum(first, idx - window + 1)
        return first.to(torch.int32).contiguous()
    return None


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `allowed`, -inf elsewhere, in `dtype`."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, float("-inf"))


def mask_mod(segment_ids: torch.Tensor, window: int | None = None) -> Callable[..., torch.Tensor]:
    """`dense_mask` as FlexAttention's mask function (b, h, q_idx, kv_idx) -> may attend."""
    seg = segment_ids

    def doc_causal(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex mask signature
        return (q_idx >= kv_idx) & (seg[b, q_idx] == seg[b, kv_idx])

    def doc_causal_window(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex mask signature
        return doc_causal(b, h, q_idx, kv_idx) & (q_idx - kv_idx < window)

    return doc_causal if window is None else doc_causal_window


# Never traced: under a `torch.compile` of the whole model (benchmarks, user code) the
# block mask is still built eagerly, outside the graph (a graph break here), as
# `AttentionContext.build_masks` builds it before the compiled region.
@torch.compiler.disable
def block_mask(segment_ids: torch.Tensor, window: int | None = None) -> object:
    """FlexAttention's block mask of `dense_mask` (of `mask_mod`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = segment_ids.shape
    return create_block_mask(mask_mod(segment_ids, window), B, None, T, T, device=segment_ids.device)
