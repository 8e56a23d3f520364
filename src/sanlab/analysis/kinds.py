"""Exercise kinds of the embedded corpus: Δ over the recall types and over the
context-grounded types of one analysed pair, each token-weighted over its types.

Recall types are the generator's `RECALL_TYPES` (the answer needs the weights: the world's
facts); every other type carries its material in the document. One definition, read by
the report's axis figure and by the records' claims, so both show the same numbers.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from sanlab.data.synth import RECALL_TYPES


def recall_types() -> tuple[str, ...]:
    return RECALL_TYPES  # the generator's, where the types are defined


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def weighted_delta(rows: Iterable[dict[str, Any]], names: set[str], key: str = "delta") -> float | None:
    """Σ tokens × `key` / Σ tokens over the rows whose group is in `names` (None: no tokens)."""
    sel = [r for r in rows if r.get("group") in names and _finite(r.get(key)) and r.get("tokens")]
    w = sum(r["tokens"] for r in sel)
    return sum(r[key] * r["tokens"] for r in sel) / w if w else None


def kind_deltas(comparison: dict[str, Any]) -> tuple[float | None, float | None]:
    """(recall Δ, context-grounded Δ) of one analysed comparison (`sanlab analyze --vs`):
    its per-exercise rows, token-weighted within each kind."""
    rows = ((comparison.get("exercise") or {}).get("rows")) or []
    groups = {r.get("group") for r in rows}
    recall = set(recall_types())
    return weighted_delta(rows, recall), weighted_delta(rows, groups - recall)


def kind_losses(losses: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """One analysed run's loss, entropy floor and loss above it over the recall and the
    context-grounded types (token-weighted over each kind's types):
    {"recall": {loss, entropy_floor, loss_above_floor}, "context": {…}}."""
    rows = (losses or {}).get("exercise") or []
    groups = {r.get("group") for r in rows}
    recall = set(recall_types())
    out = {}
    for kind, names in (("recall", recall), ("context", groups - recall)):
        out[kind] = {k: weighted_delta(rows, names, k) for k in ("loss", "entropy_floor", "loss_above_floor")}
    return out
