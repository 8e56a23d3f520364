"""Learning-rate sweep with boundary extension (SPEC §1.4), as pure functions.

Each arm × optimizer cell is swept over multipliers of its base LR. If the best point
is at an edge of what has been tried, the optimum may lie beyond it, so the next point
past that edge (×2 above, ×½ below) is added, until the loss curve turns or the
extension limit is hit. Keeping this free of I/O lets it be tested on synthetic
loss-versus-LR curves and lets `study status` replay it from stored results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class SweepDecision:
    """What to do next in one cell.

    `pending`: multipliers to run now (empty when `done`). `best`: the multiplier with
    the lowest loss so far (None if nothing finished with a finite loss). `at_edge`:
    the best is still at an edge of the tried range — its lock is a lower bound on how
    far the LR could move, which the sweep table warns about.
    """

    pending: tuple[float, ...]
    done: bool
    best: float | None
    at_edge: bool
    extensions: int


def _loss(value: float | None) -> float:
    """A failed or diverged point counts as infinitely bad, never as a winner."""
    return math.inf if value is None or not math.isfinite(value) else value


def decide(
    grid: Sequence[float],
    results: Mapping[float, float | None],
    *,
    extend: bool,
    max_extensions: int,
) -> SweepDecision:
    """The next step of one cell's sweep given the losses measured so far.

    `results` maps multiplier -> final validation loss (None / non-finite for a run
    that diverged or failed). Points of `grid` not yet measured are run first; only
    then is the edge rule applied, one extension at a time, so each new point sees the
    curve it extends.
    """
    missing = tuple(m for m in grid if m not in results)
    extensions = sum(1 for m in results if m not in grid)
    tried = sorted(results)
    if missing:
        return SweepDecision(missing, False, _best(results), False, extensions)
    best = _best(results)
    lo, hi = tried[0], tried[-1]
    # All points failed: a lower LR is the only direction that can help.
    at_low = best is None or best == lo
    at_high = best is not None and best == hi
    pending: list[float] = []
    if extend:
        budget = max_extensions - extensions
        if at_low and budget > 0:
            pending.append(lo / 2)
            budget -= 1
        if at_high and budget > 0:
            pending.append(hi * 2)
    if pending:
        return SweepDecision(tuple(pending), False, best, True, extensions)
    return SweepDecision((), True, best, at_low or at_high, extensions)


def _best(results: Mapping[float, float | None]) -> float | None:
    """Lowest-loss multiplier; ties go to the smaller LR (the safer lock)."""
    finite = [(_loss(v), m) for m, v in results.items() if math.isfinite(_loss(v))]
    return min(finite)[1] if finite else None
