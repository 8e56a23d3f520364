"""The one noise rule (sanlab.study.noise): the floor's size F = max(|mean|, sample sd) of
the noise pair's per-seed Δ; a per-seed-pair quantity is told apart from 0 when
|mean| > F + its sample sd; two independent studies add F and sd in quadrature. The gap
table's "within noise" is this rule and nothing else."""

from __future__ import annotations

import math
import statistics

import pytest

from sanlab.study import noise
from sanlab.study.table import Gap, verdict


def test_floor_size_is_the_larger_of_mean_and_sample_sd() -> None:
    assert noise.floor_size([0.0003, -0.0030]) == pytest.approx(statistics.stdev([0.0003, -0.0030]))
    assert noise.floor_size([0.0003, -0.0030]) == pytest.approx(0.0033 / math.sqrt(2))  # not pstdev's 0.00165
    assert noise.floor_size([0.01, 0.012]) == pytest.approx(0.011)  # the mean dominates
    assert noise.floor_size([-0.004]) == pytest.approx(0.004)  # one seed: |Δ|
    assert noise.floor_size([]) is None


def test_a_quantity_counts_beyond_floor_plus_its_own_sd() -> None:
    xs = [0.10, 0.12]  # mean 0.11, sd 0.01414
    sd = statistics.stdev(xs)
    assert noise.threshold(xs, 0.01) == pytest.approx(0.01 + sd)
    assert noise.sign(xs, 0.11 - sd - 1e-6) == 1
    assert noise.sign(xs, 0.11 - sd + 1e-6) == 0
    assert noise.sign([-x for x in xs], 0.05) == -1
    assert noise.sign([0.5], 0.4) == 1 and noise.sign([0.5], 0.5) == 0  # one pair: the floor alone
    assert noise.sign(xs, None) == 0 and noise.sign([], 0.0) == 0  # no floor, no values: nothing told apart


def test_independent_studies_add_floor_and_spread_in_quadrature() -> None:
    a, b = [0.30, 0.32], [0.20, 0.24]  # means 0.31 and 0.22; sds 0.01414 and 0.02828
    t = math.hypot(0.01, 0.02) + math.hypot(statistics.stdev(a), statistics.stdev(b))
    assert 0.09 - t > 0 and noise.sign_of_difference(a, b, 0.01, 0.02) == 1
    assert noise.sign_of_difference(b, a, 0.01, 0.02) == -1
    assert noise.sign_of_difference(a, b, 0.06, 0.02) == 0  # hypot(0.06, 0.02) + 0.0316 = 0.0949 > 0.09
    assert noise.sign_of_difference(a, b, None, 0.02) == 0
    # the spreads too: 0.05 + hypot(0.0141, 0.0283) = 0.0816 < 0.09 (added linearly, 0.0924)
    assert noise.sign_of_difference(a, b, 0.05, 0.0) == 1


@pytest.mark.parametrize("deltas, floor, expected", [
    ({1: -0.0100, 2: -0.0120}, {1: 0.002, 2: -0.003}, "iso_param ahead, 3× floor"),
    # F = 0.00354 (the sd of +0.002 / −0.003)
    ({1: -0.0030, 2: -0.0050}, {1: 0.002, 2: -0.003}, "within noise"),   # 0.0040 <= 0.00354 + 0.00141
    ({1: -0.0040, 2: -0.0060}, {1: 0.002, 2: -0.003}, "iso_param ahead, 1× floor"),  # 0.0050 > 0.00495
    ({1: -0.0052, 2: -0.0054}, {1: 0.002, 2: -0.003}, "iso_param ahead, 1× floor"),  # 0.0053 > 0.00354 + 0.00014
    ({1: 0.0300}, {1: 0.01}, "san ahead, 3× floor"),
    # No floor: one seed pair is no noise estimate at all; with more, the seed spread alone.
    ({1: -0.0300}, {}, "no noise estimate"),
    ({1: -0.0300, 2: -0.0310}, {}, "iso_param ahead beyond the seed spread (no floor yet)"),
    ({1: -0.0300, 2: 0.0100}, {}, "within the seed spread (no floor yet)"),  # |−0.01| <= sd 0.028
])
def test_the_gap_tables_verdict_is_the_rule(deltas: dict[int, float], floor: dict[int, float], expected: str) -> None:
    g = Gap("iso_param", "iso-param", "x", "muon", 1000, "san", per_seed=deltas)
    f = Gap("san_rms", "noise", "x", "muon", 1000, "san", per_seed=floor)
    assert verdict(g, f) == expected
    size = noise.floor_size(floor.values())
    if size is not None:
        assert (expected == "within noise") == (noise.sign(deltas.values(), size) == 0)


def test_a_floor_below_the_fourth_decimal_keeps_two_significant_digits() -> None:
    """A deterministic CPU in fp32 puts the control pair ~3e-5 apart: printed with four
    decimals it read +0.0000 ± 0.0000 beside gaps of "11166× floor". Everything that would
    round to zero but is not keeps two significant digits; the rest prints as before."""
    assert noise.nats(3.2e-5) == "+3.2e-05" and noise.nats(-3.2e-5) == "-3.2e-05"
    assert noise.nats(3.2e-5, signed=False) == "3.2e-05"
    assert noise.nats(4.99e-5) == "+5.0e-05" and noise.nats(5e-5) == "+0.0001"  # (5e-5 prints 0.0001)
    assert noise.nats(0.0) == "+0.0000" and noise.nats(-0.35834) == "-0.3583"
    assert noise.nats(0.01213, signed=False) == "0.0121"


def test_the_gap_table_and_the_report_print_a_tiny_floor_in_full() -> None:
    from sanlab.report.build import _gap_row
    from sanlab.study.table import _delta_cells

    floor = Gap("san_rms", "noise", "x", "muon", 1000, "san", per_seed={1: 3.1e-5, 2: 3.3e-5})
    per, mean_sd = _delta_cells(floor, [1, 2])
    assert per.text == "+3.1e-05 +3.3e-05" and mean_sd.text == "+3.2e-05 ± 1.4e-06"
    assert per.fields == {"s1": 3.1e-5, "s2": 3.3e-5} and mean_sd.fields["mean"] == pytest.approx(3.2e-5)
    row = _gap_row({"per_seed": {"1": 3.1e-5, "2": 3.3e-5}, "mean": 3.2e-5, "spread": 1.4e-6, "label": "x",
                    "optimizer": "muon", "tokens": 1000}, "noise floor (san_rms − san)", "")
    assert row[6] == "s1: +3.1e-05 s2: +3.3e-05" and row[7] == "+3.2e-05 ± 1.4e-06"
    g = Gap("iso_param", "iso-param", "x", "muon", 1000, "san", per_seed={1: -0.3497, 2: -0.3668})
    assert [c.text for c in _delta_cells(g, [1, 2])] == ["-0.3497 -0.3668", "-0.3583 ± 0.0121"]
