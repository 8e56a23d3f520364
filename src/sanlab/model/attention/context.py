"""The per-batch data every attention layer shares (`AttentionContext`): RoPE tables,
document positions, the backend and the masks, built once per forward (`build_context`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from sanlab.config import ModelConfig
from sanlab.model.attention import masks
from sanlab.model.attention.dispatch import resolve_backend
from sanlab.model.layers import rope_tables


@dataclass
class AttentionContext:
    """Per-batch data every attention layer shares: RoPE tables, positions, the backend and
    the masks.

    Built once per forward pass in `LM.forward`, not once per layer; each mask is built
    on first use and cached (per window, for layers that attend within one).
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
    # the masks, built on first use, by window (None: the whole document)
    _dense: dict[int | None, torch.Tensor] = field(default_factory=dict)
    _starts: dict[int | None, torch.Tensor | None] = field(default_factory=dict)
    _additive: dict[tuple[torch.dtype, int | None], torch.Tensor] = field(default_factory=dict)
    _block: dict[int | None, object] = field(default_factory=dict)

    def allowed(self, window: int | None = None) -> torch.Tensor:
        """(B, 1, T, T) bool, True where a query may see a key: causal, same document, and
        with a window the last `window` keys (`masks.dense_mask`)."""
        if window not in self._dense:
            self._dense[window] = masks.dense_mask(self.segment_ids, window)
        return self._dense[window]

    def first_keys(self, window: int | None = None) -> torch.Tensor | None:
        """(B, T) int32: the first key each query may see (`masks.row_starts`); None where a
        segment id recurs after another (the fused kernel then does not run)."""
        if window not in self._starts:
            self._starts[window] = masks.row_starts(self.segment_ids, self.positions, self.single_document, window)
        return self._starts[window]

    def additive_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """(B, 1, T, T): 0 where attention is allowed (`allowed(window)`), -inf elsewhere."""
        if (dtype, window) not in self._additive:
            self._additive[dtype, window] = masks.additive_mask(self.allowed(window), dtype)
        return self._additive[dtype, window]

    def flex_block_mask(self, window: int | None = None) -> object:
        """FlexAttention's block mask of `allowed(window)`: built by `build_masks` before the
        model's compiled region; one a layer asks for unannounced is built here, still
        outside any compiled graph (`masks.block_mask` is never traced)."""
        if window not in self._block:
            self._block[window] = masks.block_mask(self.segment_ids, window)
        return self._block[window]

    def build_masks(self, windows: Iterable[int | None]) -> None:
        """Build the masks the backend reads for these windows now, once per batch, before
        any compiled layer runs: FlexAttention's block masks (its mask function closes over
        the batch's segment ids, so built inside a compiled model it would be traced into
        the graph). The other backends' masks are tensor ops a compiled graph takes in."""
        if self.backend == "flex":
            for window in windows:
                self.flex_block_mask(window)

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
    cfg: ModelConfig, tokens: torch.Tensor, segment_ids: torch.Tensor | None, windows: Iterable[int | None] = ()
) -> AttentionContext:
    """The context of a batch, with the masks its backend reads for `windows` (the model's
    layers': `Mixer.mask_windows`) built (`AttentionContext.build_masks`)."""
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
    ctx.build_masks(windows)
    return ctx
