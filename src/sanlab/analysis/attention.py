"""Attention-pattern metrics per layer and head on the evaluation sample (SPEC §3).

Patterns are reduced to sums as each layer's `blocks.{i}.attn.pattern` hook fires, so
memory holds one layer's (B, H, T, T) pattern at a time, not the whole model's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sanlab.analysis import metrics as M

HEAD_METRICS: tuple[str, ...] = (
    "entropy",
    "concentration",
    "sink",
    *(f"local_{d}" for d in M.LOCAL_DISTANCES),
)


class AttentionCollector:
    """Accumulates `metrics.attention_sums` per layer over evaluation batches."""

    def __init__(self, n_layers: int) -> None:
        self.layers: list[M.AttentionSums | None] = [None] * n_layers

    def add(self, layer: int, pattern: Tensor, segment_ids: Tensor, query_mask: Tensor) -> None:
        """pattern: (B, H, T, T); segment_ids, query_mask: (B, T)."""
        sums = M.attention_sums(pattern, segment_ids, query_mask)
        if self.layers[layer] is None:
            self.layers[layer] = sums
        else:
            self.layers[layer].merge(sums)  # type: ignore[union-attr]

    def results(self, normalize: bool = False) -> dict[str, list[dict]]:
        """`heads`: one row per (layer, head); `layers`: head diversity and head means per layer.

        With `normalize`, every metric is min–max scaled to [0, 1] across all layers and
        heads of this run, which makes runs of different length or depth comparable in shape.
        """
        means = [s.means() if s is not None else None for s in self.layers]
        present = [(i, m) for i, m in enumerate(means) if m is not None]
        if not present:
            return {"heads": [], "layers": []}
        table = {k: torch.stack([m[k] for _, m in present]) for k in HEAD_METRICS}  # (L, H)
        diversity = torch.stack([m["head_diversity"].reshape(()) for _, m in present])  # (L,)
        if normalize:
            table = {k: M.minmax(v) for k, v in table.items()}
            diversity = M.minmax(diversity)
        heads, layers = [], []
        for row, (layer, _) in enumerate(present):
            for h in range(table["entropy"].shape[1]):
                heads.append({"layer": layer, "head": h, **{k: float(table[k][row, h]) for k in HEAD_METRICS}})
            layers.append(
                {
                    "layer": layer,
                    "head_diversity": float(diversity[row]),
                    **{k: float(table[k][row].nanmean()) for k in HEAD_METRICS},
                }
            )
        return {"heads": heads, "layers": layers}
