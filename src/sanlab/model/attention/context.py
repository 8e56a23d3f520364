"""The per-batch data every attention layer shares (`AttentionContext`): RoPE tables,
document positions, the backend and the masks, built once per forward (`build_context`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from sanlab.config import ModelConfig
from sanlab.model.attention import masks
from sanlab.model.attention.masks import DOCUMENT, Mask
from sanlab.model.attention.dispatch import resolve_backend
from sanlab.model.layers import rope_tables


@dataclass
class AttentionContext:
    """Per-batch data every attention layer shares: RoPE tables, positions, the backend and
    the masks.

    Built once per forward pass in `LM.forward`, not once per layer; each mask's forms
    are built on first use and cached per mask (`masks.Mask`).
    """

    segment_ids: torch.Tensor  # (B, T)
    positions: torch.Tensor  # (B, T) position within the document
    cos: torch.Tensor  # (B, T, 1, head_dim)
    sin: torch.Tensor  # (B, T, 1, head_dim)
    backend: str  # "fused" | "explicit" | "sdpa" | "flex" (`dispatch.resolve_backend`)
    single_document: bool = False  # every row is one document (no segment ids given)
    embedded: torch.Tensor | None = None  # (B, T, d) the scaled input embedding entering block 0
    # What mixers keep for this batch, each under a name of its own: what their `prepare`
    # hooks computed for the whole model (the stream-QK variants' fixed stream), caches.
    mixer_state: dict[str, Any] = field(default_factory=dict)
    # the masks, built on first use, by mask (`masks.Mask`: hashable, equal by value)
    _dense: dict[Mask, torch.Tensor] = field(default_factory=dict)
    _starts: dict[Mask, torch.Tensor | None] = field(default_factory=dict)
    _additive: dict[tuple[torch.dtype, Mask], torch.Tensor] = field(default_factory=dict)
    _block: dict[Mask, object] = field(default_factory=dict)

    def allowed(self, mask: Mask = DOCUMENT) -> torch.Tensor:
        """(B, 1, T, T) bool, True where a query may see a key under `mask`: causal, same
        document, and what the mask allows (`masks.dense_mask`)."""
        if mask not in self._dense:
            self._dense[mask] = masks.dense_mask(self.segment_ids, mask, self.positions)
        return self._dense[mask]

    def first_keys(self, mask: Mask = DOCUMENT) -> torch.Tensor | None:
        """(B, T) int32: the first key each query may see under `mask` (`masks.row_starts`);
        None where a segment id recurs after another or the mask has no interval form (the
        fused kernel then does not run)."""
        if mask not in self._starts:
            self._starts[mask] = masks.row_starts(self.segment_ids, self.positions, self.single_document, mask)
        return self._starts[mask]

    def additive_mask(self, dtype: torch.dtype, mask: Mask = DOCUMENT) -> torch.Tensor:
        """(B, 1, T, T): 0 where attention is allowed (`allowed(mask)`), -inf elsewhere."""
        if (dtype, mask) not in self._additive:
            self._additive[dtype, mask] = masks.additive_mask(self.allowed(mask), dtype)
        return self._additive[dtype, mask]

    def flex_block_mask(self, mask: Mask = DOCUMENT) -> object:
        """FlexAttention's block mask of `allowed(mask)`: built by `build_masks` before the
        model's compiled region; one a layer asks for unannounced is built here, still
        outside any compiled graph (`masks.block_mask` is never traced)."""
        if mask not in self._block:
            self._block[mask] = masks.block_mask(self.segment_ids, mask, self.positions)
        return self._block[mask]

    def build_masks(self, announced: Iterable[Mask]) -> None:
        """Build the masks the backend reads for these masks now, once per batch, before
        any compiled layer runs: FlexAttention's block masks (its mask function closes over
        the batch's segment ids, so built inside a compiled model it would be traced into
        the graph). The other backends' masks are tensor ops a compiled graph takes in."""
        if self.backend == "flex":
            for mask in announced:
                self.flex_block_mask(mask)

    @property
    def dense_mask(self) -> torch.Tensor:
        """(B, 1, T, T) bool: causal AND same document. True = may attend."""
        return self.allowed()

    @property
    def row_starts(self) -> torch.Tensor | None:
        """(B, T) int32: where each query's document starts (`first_keys()`)."""
        return self.first_keys()

    @property
    def block_mask(self) -> object:
        return self.flex_block_mask()


def build_context(
    cfg: ModelConfig, tokens: torch.Tensor, segment_ids: torch.Tensor | None, announced: Iterable[Mask] = ()
) -> AttentionContext:
    """The context of a batch, with the forms its backend reads of the `announced` masks
    (the model's layers': `SequenceMixer.attention_masks`) built (`AttentionContext.build_masks`)."""
    single = segment_ids is None
    if segment_ids is None:
        segment_ids = torch.zeros_like(tokens)
    positions = masks.segment_positions(segment_ids)
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    ctx = AttentionContext(
        segment_ids=segment_ids,
        positions=positions,
        cos=cos,
        sin=sin,
        backend=resolve_backend(cfg, tokens),
        single_document=single,
    )
    ctx.build_masks(announced)
    return ctx
