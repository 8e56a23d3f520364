"""Boundary extension (SPEC §1.4) on synthetic loss-versus-LR curves."""

from __future__ import annotations

import math
from typing import Callable

import pytest

from sanlab.study.sweep import decide

GRID = [0.5, 1.0, 2.0]


def bowl(opt: float) -> Callable[[float], float]:
    """A loss curve with its minimum at multiplier `opt` (quadratic in log LR)."""
    return lambda m: 2.0 + 0.01 * math.log2(m / opt) ** 2


def drive(loss: Callable[[float], float | None], grid: list[float] = GRID, *, extend: bool = True,
          max_extensions: int = 4) -> tuple[dict[float, float | None], object]:
    """Run the sweep to the end the way the study does: measure pending points, decide again."""
    results: dict[float, float | None] = {}
    for _ in range(50):
        d = decide(grid, results, extend=extend, max_extensions=max_extensions)
        if d.done:
            return results, d
        for m in d.pending:
            results[m] = loss(m)
    raise AssertionError("sweep did not terminate")


def test_grid_points_run_first_then_edge_rule():
    d = decide(GRID, {1.0: 2.0}, extend=True, max_extensions=4)
    assert d.pending == (0.5, 2.0) and not d.done


def test_interior_best_stops_without_extension():
    results, d = drive(bowl(1.0))
    assert sorted(results) == GRID
    assert d.best == 1.0 and not d.at_edge and d.extensions == 0


def test_extends_right_until_the_curve_turns():
    results, d = drive(bowl(8.0))
    assert sorted(results) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert d.best == 8.0 and not d.at_edge and d.extensions == 3


def test_extends_left_at_the_bottom_edge():
    results, d = drive(bowl(0.1))
    assert sorted(results) == [0.0625, 0.125, 0.25, 0.5, 1.0, 2.0]
    assert d.best == 0.125 and not d.at_edge


def test_stops_at_the_limit_and_flags_the_edge():
    results, d = drive(bowl(100.0), max_extensions=2)
    assert sorted(results) == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert d.best == 8.0 and d.at_edge and d.extensions == 2


def test_extension_off_keeps_the_grid_and_flags_the_edge():
    results, d = drive(bowl(8.0), extend=False)
    assert sorted(results) == GRID
    assert d.best == 2.0 and d.at_edge


def test_paper_ffn_adamw_row():
    """SPEC §1.4 anchor: FFN AdamW turns only after 16×, locking 8×."""
    row = {0.5: 2.305, 1.0: 2.254, 2.0: 2.230, 4.0: 2.219, 8.0: 2.199, 16.0: 2.216}
    results, d = drive(row.__getitem__)
    assert sorted(results) == sorted(row) and d.best == 8.0 and not d.at_edge


@pytest.mark.parametrize("diverge_above", [1.0, 0.4])
def test_diverged_points_never_win_and_push_the_lr_down(diverge_above: float):
    curve = bowl(4.0)
    results, d = drive(lambda m: None if m > diverge_above else curve(m))
    finite = {m: v for m, v in results.items() if v is not None}
    assert d.best == max(finite)
    assert all(results[m] is None for m in results if m > diverge_above)


def test_single_point_grid_extends_both_ways():
    d = decide([1.0], {1.0: 2.0}, extend=True, max_extensions=4)
    assert d.pending == (0.5, 2.0)
