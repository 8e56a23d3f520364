"""benchmarks/bench_arms.py's matrix-product table: FLOPs from the profiler's shapes."""

from __future__ import annotations

import pytest
import torch


def test_product_flops_from_operand_shapes(load_benchmark):
    ba = load_benchmark("bench_arms")
    assert ba.product_flops("aten::mm", [[3, 5], [5, 7]]) == 2 * 3 * 5 * 7
    assert ba.product_flops("aten::bmm", [[4, 3, 5], [4, 5, 7]]) == 2 * 4 * 3 * 5 * 7
    assert ba.product_flops("aten::addmm", [[7], [3, 5], [5, 7], [], []]) == 2 * 3 * 5 * 7  # the bias is no operand
    assert ba.product_flops("aten::baddbmm", [[4, 3, 7], [4, 3, 5], [4, 5, 7], [], []]) == 2 * 4 * 3 * 5 * 7
    with pytest.raises(ValueError, match="do not multiply"):
        ba.product_flops("aten::mm", [[3, 5], [6, 7]])


def test_product_rows_from_a_real_profile(load_benchmark):
    """Two products of known shape, profiled: each row has its calls, and its GFLOP/s
    times its time is its FLOPs; other ops are left out."""
    ba = load_benchmark("bench_arms")
    a, b = torch.randn(4, 64, 32), torch.randn(4, 32, 48)
    m, n = torch.randn(40, 24), torch.randn(24, 16)
    with torch.profiler.profile(record_shapes=True) as prof:
        for _ in range(3):
            torch.bmm(a, b)
        torch.mm(m, n)
        torch.softmax(m, -1)
    rows = {r[0]: r for r in ba.product_rows(prof.key_averages(group_by_input_shape=True))}
    assert set(rows) == {"bmm", "mm"}
    op, shapes, calls, ms, gflops = rows["bmm"]
    assert shapes == "[4, 64, 32] @ [4, 32, 48]" and calls == 3
    assert gflops * 1e9 * ms / 1e3 == pytest.approx(3 * 2 * 4 * 64 * 32 * 48, rel=1e-9)
    op, shapes, calls, ms, gflops = rows["mm"]
    assert shapes == "[40, 24] @ [24, 16]" and calls == 1
    assert gflops * 1e9 * ms / 1e3 == pytest.approx(2 * 40 * 24 * 16, rel=1e-9)
    assert ba.product_rows(prof.key_averages(group_by_input_shape=True), limit=1)[0][3] == max(r[3] for r in rows.values())


def test_excess_is_the_speed_ratio_over_the_flop_ratio(load_benchmark):
    """A partner twice as fast per step at 1.6x fewer FLOPs has excess 2 / 1.6; one whose
    speed follows its FLOPs exactly has 1."""
    ba = load_benchmark("bench_arms")
    step = {"san": 0.2, "iso_param": 0.1, "iso_depth": 0.4}
    flops = {"san": 1.6e9, "iso_param": 1.0e9, "iso_depth": 3.2e9}
    ex = ba.excess_ratios(step, flops)
    assert set(ex) == {"iso_param", "iso_depth"}
    assert ex["iso_param"] == pytest.approx(2 / 1.6)
    assert ex["iso_depth"] == pytest.approx(1.0)


def test_paired_excess_round_by_round(load_benchmark):
    """Each round's SAN step against the same round's partner step: a machine that slows
    down 5x over the run leaves every round's excess at 2 / 1.6, so the interval is that
    point; noisy rounds give an interval around their median, the same on a rerun."""
    import statistics

    ba = load_benchmark("bench_arms")
    flops = {"san": 1.6e9, "iso_param": 1.0e9}
    drift = [1.0, 2.0, 3.0, 4.0, 5.0]
    times = {"san": [0.2 * f for f in drift], "iso_param": [0.1 * f for f in drift]}
    med, lo, hi = ba.paired_excess(times, flops)["iso_param"]
    assert med == lo == hi == pytest.approx(2 / 1.6)
    # per-round excess 1.0, 1.5, 1.25, 2.0, 1.1 (san / partner / 1.6)
    times = {"san": [1.6, 2.4, 2.0, 3.2, 1.76], "iso_param": [1.0] * 5}
    med, lo, hi = ba.paired_excess(times, flops)["iso_param"]
    assert med == pytest.approx(statistics.median([1.0, 1.5, 1.25, 2.0, 1.1]))
    assert 1.0 <= lo < med < hi <= 2.0
    assert ba.paired_excess(times, flops)["iso_param"] == (med, lo, hi)
    few = {"san": [1.6, 2.4], "iso_param": [1.0, 1.0]}
    med, lo, hi = ba.paired_excess(few, flops)["iso_param"]
    assert med == pytest.approx(1.25) and lo != lo and hi != hi  # NaN: too few rounds for an interval
    assert ba.interval_label(med, lo, hi) == "1.25x (< 5 rounds: no interval)"
    assert ba.interval_label(1.3, 1.26, 1.351) == "1.30x [1.26, 1.35]"
    # three processes whose rounds sit at 1.2, 1.3 and 1.4: pooled as one, the median's
    # interval stays near the middle process's level; resampling processes first spans them
    levels = [1.2] * 10 + [1.3] * 10 + [1.4] * 10
    spread = {"san": [1.6 * x for x in levels], "iso_param": [1.0] * 30}
    med, lo, hi = ba.paired_excess(spread, flops)["iso_param"]
    assert med == pytest.approx(1.3) and lo >= 1.25 - 1e-9 and hi <= 1.35 + 1e-9
    med, lo, hi = ba.paired_excess(spread, flops, groups=[10, 10, 10])["iso_param"]
    assert med == pytest.approx(1.3) and lo == pytest.approx(1.2) and hi == pytest.approx(1.4)
    with pytest.raises(ValueError, match="do not add up"):
        ba.paired_excess(spread, flops, groups=[10, 10])
    with pytest.raises(ValueError, match="not paired"):
        ba.paired_excess({"san": [1.0, 2.0], "iso_param": [1.0]}, flops)


def test_repeats_report_each_process_and_the_pooled_rounds(load_benchmark, monkeypatch):
    """--repeats 2 on a tiny shape: two child processes, each partner's excess in each,
    and what the shape returns (the grid summary's figure) is the excess round by round
    over both processes' rounds, as printed."""
    import argparse
    import io

    from rich.console import Console

    ba = load_benchmark("bench_arms")
    a = argparse.Namespace(layers=2, d=32, heads=2, kv_heads=1, seq_len=32, batch=2, vocab=64, precision="bf16",
                           device="cpu", steps=3, warmup=1, threads=1, compile=False, profile=False, repeats=2)
    calls = []
    real = ba.paired_excess

    def recording(times, flops, **kw):
        calls.append(kw.get("groups"))
        return real(times, flops, **kw)

    monkeypatch.setattr(ba, "paired_excess", recording)
    out = io.StringIO()
    excess = ba._shape_table(a, Console(file=out, width=200))
    assert calls[-1] == [3, 3]  # the pooled interval resamples the two processes, then their rounds
    line = " ".join(out.getvalue().split())
    assert "excess in each of 2 processes" in line and "per round over all 2 processes (6 rounds)" in line
    each, pooled = line.split("excess in each of 2 processes", 1)[1].split("per round over all 2 processes", 1)
    assert set(excess) == {"iso_param", "iso_flop", "iso_depth"}
    for arm, (median, lo, hi) in excess.items():
        assert lo <= median <= hi
        xs = each.split(f"{arm} ", 1)[1].split(" (median", 1)[0].split()  # "x1 x2"
        assert len(xs) == 2
        printed = pooled.split(f"{arm} ", 1)[1].split("]", 1)[0]  # "1.23x [1.10, 1.31"
        assert printed == f"{median:.2f}x [{lo:.2f}, {hi:.2f}"


def test_the_gpu_grid_is_the_base_san_up_to_4096(load_benchmark):
    """--grid on CUDA runs the paper's base SAN (20L d512, 8/4 heads) from T 1024 to 4096
    at the same tokens a step; on the CPU it runs the CPU grid (T 256 … 2048)."""
    ba = load_benchmark("bench_arms")
    assert ba.grid("cpu") == ba.GRID and [g[4] for g in ba.GRID] == [256, 512, 1024, 2048]
    gpu = ba.grid("cuda")
    assert [g[4] for g in gpu] == [1024, 2048, 4096]
    assert {g[:4] for g in gpu} == {(20, 512, 8, 4)}
    assert len({g[4] * g[5] for g in gpu}) == 1  # tokens a step
