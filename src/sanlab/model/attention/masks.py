"""The masks attention applies, from a batch's segment ids.

A mask is one object (`Mask`): a token always sees only itself and earlier tokens
(causal) of its own document (segment id), and a mask may limit that further by a
function over (query, key) (`Mask.allows`): `DOCUMENT` sees the whole document so far,
`Window(w)` the last `w` of those keys (itself included: token i sees key j when
0 ≤ i − j < w), a mixer's own mask whatever its file defines. From that one definition
(`Mask.visible`) come the forms the kernels take: a dense bool mask, an additive one, a
FlexAttention block mask, and the decode cache's mask; and, for a mask whose keys are one
interval per row ending at the query (`Mask.first_key`), each row's first visible key,
the fused kernel's form (a mask without one runs on the explicit kernel or SDPA there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Mask:
    """Which keys a query sees: causal and within its document (`visible`), limited
    further by `allows`. Every backend reads it (dense and additive masks for the explicit
    kernel and SDPA, a block mask for FlexAttention, each row's first key for the fused
    kernel where `first_key` gives one) and so does the softmax KV cache.

    A mask is a frozen dataclass, hashable and equal by value: an `AttentionContext`
    builds each form once per batch and mask. A new mask is a subclass with its parameters
    as fields, `allows`, and `first_key` where its keys are one interval ending at the
    query (without it the mask still runs everywhere, off the fused kernel).
    """

    def allows(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Where query q may see key k beyond causal and same-document (a bool tensor, the
        arguments' broadcast shape), None for everywhere. q, k: indices in the row;
        q_pos, k_pos: positions in the document (`segment_positions`). Called on
        broadcastable (B, T, 1) / (B, 1, T) tensors and on FlexAttention's scalars: write
        it with comparisons (`k > q - w`, not `q - k < w`) so no integer (T, T) tensor is
        made."""
        return None

    def first_key(self, q_pos: torch.Tensor) -> torch.Tensor | None:
        """The interval form: the document position of the first key a query at document
        position `q_pos` sees, when its keys are exactly [that, q_pos] (same shape as
        `q_pos`); None where the mask has no such form (the fused kernel does not run)."""
        return None

    def visible(self, doc_q: torch.Tensor, doc_k: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The definition every form is built from: same document, j ≤ i, and `allows`."""
        seen = (q >= k) & (doc_q == doc_k)
        more = self.allows(q, k, q_pos, k_pos)
        return seen if more is None else seen & more


@dataclass(frozen=True)
class Document(Mask):
    """Every earlier key of the document, the query's own included."""

    def first_key(self, q_pos: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(q_pos)


DOCUMENT = Document()


@dataclass(frozen=True)
class Window(Mask):
    """The last `window` keys of the document, the query's own included (0 ≤ i − j < window)."""

    window: int

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"attention window: a positive number of keys or None, not {self.window!r}")

    def allows(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return k > q - self.window  # i − j < window

    def first_key(self, q_pos: torch.Tensor) -> torch.Tensor:
        return (q_pos - self.window + 1).clamp_min(0)


def window(keys: int | None) -> Mask:
    """The mask of a window of `keys` keys (None: the whole document, `DOCUMENT`); a
    ValueError for anything but a positive int or None."""
    return DOCUMENT if keys is None else Window(keys)


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its segment (document): restarts at 0. (B, T) -> (B, T)."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    is_start = torch.ones_like(segment_ids, dtype=torch.bool)
    is_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_idx = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


def dense_mask(segment_ids: torch.Tensor, mask: Mask = DOCUMENT, positions: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, T, T) bool: `mask.visible` at every (query, key) of each row. True = may
    attend. `positions`: `segment_positions(segment_ids)` where the caller has it."""
    seg = segment_ids
    pos = segment_positions(seg) if positions is None else positions
    idx = torch.arange(seg.shape[1], device=seg.device)
    return mask.visible(seg[:, :, None], seg[:, None, :], idx[:, None], idx[None, :],
                        pos[:, :, None], pos[:, None, :])[:, None]


def row_starts(segment_ids: torch.Tensor, positions: torch.Tensor, single_document: bool,
               mask: Mask = DOCUMENT) -> torch.Tensor | None:
    """(B, T) int32: the first key each query may see, its document's start plus the
    mask's first key (`Mask.first_key`; the fused kernel's mask: row i sees keys
    [row_starts[i], i]). That describes the dense mask exactly when every segment id is
    one run in its row, as packed rows are (ids rise along the row); None otherwise (an id
    that recurs after another) or when the mask has no interval form."""
    seg = segment_ids
    lo = mask.first_key(positions)
    if lo is not None and (single_document or bool((seg[:, 1:] >= seg[:, :-1]).all())):
        idx = torch.arange(seg.shape[1], device=seg.device)
        first = idx - positions + lo
        return first.to(torch.int32).contiguous()
    return None


def decode_mask(mask: Mask, q_pos: torch.Tensor, keys: int) -> torch.Tensor:
    """(T, keys) bool: `mask.visible` for the new tokens at positions `q_pos` (T,) of one
    document whose first `keys` tokens are cached (a decode cache's mask)."""
    k = torch.arange(keys, device=q_pos.device)[None, :]
    q = q_pos[:, None]
    doc = torch.zeros((), dtype=torch.long, device=q_pos.device)
    return mask.visible(doc, doc, q, k, q, k)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `allowed`, -inf elsewhere, in `dtype`."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, float("-inf"))


def mask_mod(segment_ids: torch.Tensor, mask: Mask = DOCUMENT,
             positions: torch.Tensor | None = None) -> Callable[..., torch.Tensor]:
    """`mask.visible` as FlexAttention's mask function (b, h, q_idx, kv_idx) -> may attend."""
    seg = segment_ids
    pos = segment_positions(seg) if positions is None else positions

    def visible(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex mask signature
        return mask.visible(seg[b, q_idx], seg[b, kv_idx], q_idx, kv_idx, pos[b, q_idx], pos[b, kv_idx])

    return visible


# Never traced: under a `torch.compile` of the whole model (benchmarks, user code) the
# block mask is still built eagerly, outside the graph (a graph break here), as
# `AttentionContext.build_masks` builds it before the compiled region.
@torch.compiler.disable
def block_mask(segment_ids: torch.Tensor, mask: Mask = DOCUMENT, positions: torch.Tensor | None = None) -> object:
    """FlexAttention's block mask of `mask` (of `mask_mod`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = segment_ids.shape
    return create_block_mask(mask_mod(segment_ids, mask, positions), B, None, T, T, device=segment_ids.device)
