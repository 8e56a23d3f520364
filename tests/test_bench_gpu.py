"""benchmarks/bench_gpu.py's smoke run on the CPU: every arm timed, and its speed ratio,
FLOP ratio and excess printed consistently."""

from __future__ import annotations

import re

import pytest


def test_bench_gpu_smoke_run_prints_the_excess(capsys, load_benchmark):
    bg = load_benchmark("bench_gpu")
    assert bg.main(["--device", "cpu", "--tiny", "--backends", "sdpa", "--no-compile"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "│ sdpa" in line]
    assert len(rows) == 4  # the SAN and its three partners
    assert "no FFN" in rows[0]
    for row in rows[1:]:
        cells = [c.strip() for c in row.split("│")]
        speed = float(cells[5].rstrip("×"))
        flop_ratio = float(cells[6])
        excess = float(cells[7].rstrip("×"))
        # each printed to 2 decimals: the quotient of the rounded values is off by at most
        # the rounding's relative errors added up
        bound = 0.005 / speed + 0.005 / flop_ratio + 0.005 / excess
        assert excess == pytest.approx(speed / flop_ratio, rel=bound)
        assert re.fullmatch(r"[\d.]+%", cells[10])  # MFU


def test_bench_gpu_unknown_backend_is_one_line(load_benchmark, capsys, monkeypatch):
    from sanlab.cliargs import script_main

    bench = load_benchmark("bench_gpu")
    monkeypatch.setattr("sys.argv", ["bench_gpu.py"])
    assert script_main(lambda: bench.main(["--device", "cpu", "--tiny", "--backends", "sdpa,nosuch"])) == 2
    assert capsys.readouterr().err == ("bench_gpu.py: error: --backends: unknown backend 'nosuch' (flex, sdpa or "
                                       "explicit) (see `bench_gpu.py --help`)\n")
