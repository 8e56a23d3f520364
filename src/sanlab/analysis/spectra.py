"""Weight spectra over a run's milestone checkpoints (SPEC §1.6).

For every hidden matrix (Q, K, V, O and FFN gate / up / down) in every layer and at every
milestone: stable rank, entropy effective rank and spectral norm; their mean per matrix
type; and per type the *crystallisation point*: the first milestone after which, between
every pair of consecutive milestones, neither the spectrum's shape nor its stable rank
changes by `tol` or more — the shape as the total-variation distance between normalised
singular-value spectra (mean over layers), the stable rank as the relative change of the
type's mean stable rank (the curve the report draws). The shape alone is not enough: a
matrix whose top singular value grows while the rest stay put keeps a nearly constant
normalised spectrum (its top value carries a small share of the sum) while its stable
rank ‖W‖²_F/‖W‖²₂ falls steeply. The paper finds routing matrices (Q, K) crystallise
within the first quarter while content matrices (V, O, down) keep gaining stable rank.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor

from sanlab.analysis import metrics as M
from sanlab.analysis.rundir import RunDir
from sanlab.errors import CheckpointError

# parameter path inside a block -> short matrix type (architecture.md parameter names)
KNOWN_TYPES: dict[str, str] = {
    "attn.wq": "Q",
    "attn.wk": "K",
    "attn.wv": "V",
    "attn.wo": "O",
    "ffn.w_gate": "gate",
    "ffn.w_up": "up",
    "ffn.w_down": "down",
}
TYPE_ORDER = ("Q", "K", "V", "O", "gate", "up", "down")
_BLOCK_PARAM = re.compile(r"^blocks\.(\d+)\.(.+)\.weight$")
DEFAULT_TOL = 0.02


def matrix_type(name: str) -> tuple[int, str] | None:
    """(layer, type) of a block's 2-D weight name; other variants' matrices keep their path."""
    m = _BLOCK_PARAM.match(name)
    if m is None:
        return None
    return int(m.group(1)), KNOWN_TYPES.get(m.group(2), m.group(2))


def _type_key(t: str) -> tuple[int, str]:
    return (TYPE_ORDER.index(t), "") if t in TYPE_ORDER else (len(TYPE_ORDER), t)


def state_spectra(state: dict[str, Tensor], device: str | torch.device = "cpu") -> dict[tuple[int, str], Tensor]:
    """Singular values (descending, CPU float64) of every block matrix of a state dict.

    Matrices of equal shape go through one batched SVD; on a GPU in float32 (plenty for
    ranks and a large speed-up), on the CPU in float64.
    """
    groups: dict[tuple[int, ...], list[tuple[tuple[int, str], Tensor]]] = defaultdict(list)
    for name, w in state.items():
        key = matrix_type(name)
        if key is not None and w.ndim == 2:
            groups[tuple(w.shape)].append((key, w))
    dtype = torch.float32 if torch.device(device).type == "cuda" else torch.float64
    out: dict[tuple[int, str], Tensor] = {}
    for items in groups.values():
        ok = [(key, w) for key, w in items if bool(torch.isfinite(w).all())]
        for key, w in items:
            if not bool(torch.isfinite(w).all()):  # a diverged run: NaN spectra, recorded not raised
                out[key] = M.singular_values(w)
        if ok:
            stack = torch.stack([w for _, w in ok]).to(device, dtype)  # (n, m, k)
            s = torch.linalg.svdvals(stack).to("cpu", torch.float64)  # (n, min(m, k))
            for (key, _), sv in zip(ok, s):
                out[key] = sv
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], _type_key(kv[0][1]))))


@dataclass
class SpectraResult:
    """Rows ready for CSV/JSON: per matrix, per type mean, per type crystallisation."""

    per_matrix: list[dict]  # milestone, layer, type, stable_rank, effective_rank, spectral_norm
    per_type: list[dict]  # milestone, type, mean of the three
    crystallisation: list[dict]  # type, milestone (or None), distances between milestones
    tol: float


def spectra_over_milestones(
    milestones: list[tuple[float, dict[tuple[int, str], Tensor]]], tol: float = DEFAULT_TOL
) -> SpectraResult:
    """Tabulate spectra given (fraction of training, singular values per (layer, type))."""
    per_matrix: list[dict] = []
    per_type: list[dict] = []
    for frac, spectra in milestones:
        by_type: dict[str, list[dict]] = defaultdict(list)
        for (layer, typ), s in spectra.items():
            row = {
                "milestone": frac,
                "layer": layer,
                "type": typ,
                "stable_rank": M.stable_rank(s),
                "effective_rank": M.entropy_effective_rank(s),
                "spectral_norm": M.spectral_norm(s),
            }
            per_matrix.append(row)
            by_type[typ].append(row)
        for typ in sorted(by_type, key=_type_key):
            rows = by_type[typ]
            per_type.append(
                {
                    "milestone": frac,
                    "type": typ,
                    "layers": len(rows),
                    **{
                        k: sum(r[k] for r in rows) / len(rows)
                        for k in ("stable_rank", "effective_rank", "spectral_norm")
                    },
                }
            )

    crystal: list[dict] = []
    types = sorted({t for _, sp in milestones for (_, t) in sp}, key=_type_key)
    mean_rank = {(r["milestone"], r["type"]): r["stable_rank"] for r in per_type}
    for typ in types:
        distances: list[float] = []
        rank_changes: list[float] = []
        for (fa, a), (fb, b) in zip(milestones, milestones[1:]):
            keys = [k for k in a if k[1] == typ and k in b]
            distances.append(sum(M.spectrum_distance(a[k], b[k]) for k in keys) / max(len(keys), 1))
            rank_changes.append(relative_change(mean_rank.get((fa, typ)), mean_rank.get((fb, typ))))
        changes = [math.nan if math.isnan(d) or math.isnan(r) else max(d, r) for d, r in zip(distances, rank_changes)]
        idx = M.crystallisation_index(changes, tol)
        crystal.append(
            {
                "type": typ,
                "milestone": milestones[idx][0] if idx is not None else None,
                "distances": distances,
                "rank_changes": rank_changes,
            }
        )
    return SpectraResult(per_matrix, per_type, crystal, tol)


def relative_change(a: float | None, b: float | None) -> float:
    """|b − a| / |a|: how much a curve moves between two milestones (NaN when undefined,
    which never counts as settled)."""
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or a == 0:
        return math.nan
    return abs(b - a) / abs(a)


def run_spectra(run: RunDir, tol: float = DEFAULT_TOL, device: str | torch.device = "cpu") -> SpectraResult:
    """Spectra of every milestone checkpoint of a run (at least one is needed)."""
    ms = run.milestones()
    if not ms:
        have = ", ".join(run.checkpoints()) or "none"
        raise CheckpointError(f"{run.path}: no milestone checkpoints for spectra (available: {have})")
    return spectra_over_milestones([(f, state_spectra(run.state_dict(n), device)) for f, n in ms], tol)
