"""The noise rule (SPEC §1.4), defined once: when a measured difference counts as one.

A study measures every quantity per seed pair (the same seed in both arms), and two
things bound what it can tell apart from zero:

- **the noise floor** F: the gap between the two halves of the control pair, the
  reference with its norm swapped, which the optimizer cannot tell apart (same seeds).
  F is the larger of |its mean| and its seed-to-seed sd. On a GPU it is the run-to-run
  noise of non-deterministic kernels (+0.0015 nats in the paper); on a deterministic CPU
  the pair differs only by what floating-point rounding does to a training run.
- **the quantity's own spread** s: the sample sd of its per-seed-pair values (0 with one
  seed pair). On a deterministic CPU this seed-to-seed spread, not the floor, is usually
  the larger error bar.

A quantity x (a gap; a difference of two gaps; the change of a gap or of a loss with the
budget; a region's Δ) is told apart from 0 when |mean x| > F + s; otherwise it is
"within noise". For a difference of two independent measurements (two studies) F and s
are those of the difference: each side's F and s added in quadrature. Without a finished
noise pair there is no F and nothing is told apart.

The gap table's "within noise" (`sanlab.study.table.verdict`), the LR sweep's warning of a
lock that beats its runner-up by no more than F (`sanlab.study.table.unresolved_lock`: one
seed, so s is 0 and unmeasured), the report's noise band and every verdict of a record
(`sanlab.records`) use this module, and nothing else.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable


def nats(v: float, signed: bool = True) -> str:
    """A gap, spread or floor in nats as the tables and figures print it: four decimals,
    except a value that is not zero but would print as 0.0000, which keeps two significant
    digits (`+3.2e-05`). The floor of a deterministic CPU in fp32 is of that size: shown
    as 0.0000, it looked like no floor at all beside the verdicts it sets."""
    if v != 0 and math.isfinite(v) and abs(v) < 5e-5:
        return f"{v:+.1e}" if signed else f"{v:.1e}"
    return f"{v:+.4f}" if signed else f"{v:.4f}"


def mean_spread(values: Iterable[float]) -> tuple[float | None, float | None]:
    """(mean, sample sd) of per-seed-pair values; the sd is None with fewer than two."""
    xs = list(values)
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def floor_size(per_seed: Iterable[float]) -> float | None:
    """F: the larger of |mean| and the sd of the noise-floor pair's per-seed Δ (None
    before the pair has a finished seed)."""
    m, sd = mean_spread(per_seed)
    if m is None:
        return None
    return max(abs(m), sd or 0.0)


def threshold(values: Iterable[float], floor: float) -> float:
    """F + s: how far from 0 the mean of `values` must be to count."""
    return floor + (mean_spread(values)[1] or 0.0)


def sign(values: Iterable[float], floor: float | None) -> int:
    """+1 / −1 when the per-seed-pair values are above / below 0 by more than F + s; 0 when
    within noise, when there are no values or when there is no floor."""
    xs = list(values)
    m = mean_spread(xs)[0]
    if m is None or floor is None:
        return 0
    t = threshold(xs, floor)
    return 1 if m > t else (-1 if m < -t else 0)


def sign_of_difference(a: Iterable[float], b: Iterable[float], floor_a: float | None,
                       floor_b: float | None) -> int:
    """The rule for mean(a) − mean(b), two independent measurements (not seed pairs): F
    and s of the difference are each side's added in quadrature."""
    (ma, sa), (mb, sb) = mean_spread(a), mean_spread(b)
    if ma is None or mb is None or floor_a is None or floor_b is None:
        return 0
    t = math.hypot(floor_a, floor_b) + math.hypot(sa or 0.0, sb or 0.0)
    d = ma - mb
    return 1 if d > t else (-1 if d < -t else 0)
