"""Schedules are pure functions of the step; check them at their boundary points (SPEC §1.3)."""

from __future__ import annotations

import math

import pytest

from sanlab.config import OptimConfig
from sanlab.train.schedule import constant, cosine, lr_multiplier, wsd

TOTAL = 1000  # 5% warmup = 50 steps, 15% decay = the last 150 steps


def test_wsd_warmup_is_linear_and_reaches_the_peak() -> None:
    assert wsd(0, TOTAL, 0.05, 0.15, 0.05) == pytest.approx(1 / 50)
    assert wsd(24, TOTAL, 0.05, 0.15, 0.05) == pytest.approx(25 / 50)
    assert wsd(49, TOTAL, 0.05, 0.15, 0.05) == 1.0  # last warmup step is at the peak
    assert wsd(50, TOTAL, 0.05, 0.15, 0.05) == 1.0


def test_wsd_stable_then_cosine_to_final_fraction() -> None:
    assert wsd(849, TOTAL, 0.05, 0.15, 0.05) == 1.0  # last stable step
    first_decay = wsd(850, TOTAL, 0.05, 0.15, 0.05)
    assert 0.99 < first_decay < 1.0
    # Halfway through the decay the cosine is at the midpoint between peak and floor.
    assert wsd(850 + 74, TOTAL, 0.05, 0.15, 0.05) == pytest.approx(0.05 + 0.95 * 0.5)
    # About a quarter of the way in (38 of 150 decay steps done), the cosine (0.857) lies
    # well above a linear ramp (0.759).
    quarter = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 38 / 150))
    assert wsd(850 + 37, TOTAL, 0.05, 0.15, 0.05) == pytest.approx(quarter)
    assert wsd(999, TOTAL, 0.05, 0.15, 0.05) == pytest.approx(0.05)  # last step at the floor
    values = [wsd(s, TOTAL, 0.05, 0.15, 0.05) for s in range(850, 1000)]
    assert all(a > b for a, b in zip(values, values[1:]))  # strictly decreasing


def test_wsd_without_warmup_or_decay_is_constant() -> None:
    assert {wsd(s, 10, 0.0, 0.0, 0.05) for s in range(10)} == {1.0}


def test_cosine_and_constant() -> None:
    assert cosine(0, 100, 0.1, 0.0) == pytest.approx(0.1)
    assert cosine(9, 100, 0.1, 0.0) == 1.0
    assert cosine(10 + 44, 100, 0.1, 0.0) == pytest.approx(0.5)
    assert cosine(99, 100, 0.1, 0.1) == pytest.approx(0.1)
    assert constant(0, 100, 0.1) == pytest.approx(0.1)
    assert constant(50, 100, 0.1) == 1.0 and constant(99, 100, 0.1) == 1.0


@pytest.mark.parametrize("schedule", ["wsd", "cosine", "constant"])
def test_lr_multiplier_is_pure_and_bounded(schedule: str) -> None:
    cfg = OptimConfig(schedule=schedule)
    first = [lr_multiplier(cfg, s, 37) for s in range(37)]
    again = [lr_multiplier(cfg, s, 37) for s in reversed(range(37))][::-1]
    assert first == again
    assert all(0 < m <= 1 and math.isfinite(m) for m in first)
