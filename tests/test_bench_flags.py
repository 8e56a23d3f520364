"""The benchmarks keep the input contract every sanlab command keeps: a flag's bad value (a
zero count, a negative warmup, an unknown shape or device, a model shape sanlab cannot build)
ends as one `PROG: error: …` line naming it, exit 2, before any timing starts; a timing
process that dies ends the benchmark instead of leaving it waiting (`benchmarks/_children.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sanlab.cliargs import script_main

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

BAD = [  # (benchmark, flags, what the line says)
    ("bench_analysis", ["--layers", "0"], "argument --layers: must be >= 1, got '0'"),
    ("bench_analysis", ["--eval-rows", "-3"], "argument --eval-rows: must be >= 1, got '-3'"),
    ("bench_arms", ["--threads", "0"], "argument --threads: must be >= 1, got '0'"),
    ("bench_arms", ["--warmup", "-1"], "argument --warmup: must be >= 0, got '-1'"),
    ("bench_arms", ["--batch", "0"], "argument --batch: must be >= 1, got '0'"),
    ("bench_arms", ["--heads", "3"], "flags: n_heads=3 does not divide d_model=128"),
    ("bench_attention", ["--seq-lens", "128", "0"], "argument --seq-lens: must be >= 1, got '0'"),
    ("bench_attention", ["--rounds", "0"], "argument --rounds: must be >= 1, got '0'"),
    ("bench_attention", ["--kv-heads", "3"], "--kv-heads 3 must divide --heads 8"),
    ("bench_data", ["--train-steps", "-1"], "argument --train-steps: must be >= 1, got '-1'"),
    ("bench_data", ["--tokens", "nope"], "--tokens 'nope': expected a count"),
    ("bench_gpu", ["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ("bench_gpu", ["--mean-doc", "3"], "argument --mean-doc: must be >= 4, got '3'"),
    ("bench_members", ["--steps", "0"], "argument --steps: must be >= 1, got '0'"),
    ("bench_members", ["--rounds", "-2"], "argument --rounds: must be >= 1, got '-2'"),
    ("bench_members", ["--shapes", "demo,nope"], "--shapes: unknown shape 'nope' (known: demo, probe, facts)"),
    ("bench_peer_gpu", ["--steps", "0"], "argument --steps: must be >= 1, got '0'"),
    ("bench_sample", ["--contexts", "32,0"], "argument --contexts: every value must be >= 1, got '32,0'"),
    ("bench_sample", ["--contexts", "nope"], "argument --contexts: expected comma-separated integers, got 'nope'"),
    ("bench_sample", ["--new", "0"], "argument --new: must be >= 1, got '0'"),
    ("bench_sample", ["--vocab", "8"], "argument --vocab: must be >= 9, got '8'"),
    ("bench_sample", ["--d-model", "63"], "flags: n_heads=8 does not divide d_model=63"),
    ("bench_train", ["--rounds", "0"], "argument --rounds: must be >= 1, got '0'"),
    ("bench_train", ["--heads", "3"], "flags: n_heads=3 does not divide d_model=256"),
]


@pytest.mark.parametrize("bench,flags,says", BAD, ids=[f"{b}{' '.join(f)}" for b, f, _ in BAD])
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_runs(load_benchmark, monkeypatch, capsys,
                                                                 bench, flags, says):
    module = load_benchmark(bench)

    def start(self):  # (nothing may be timed before the flags are checked: the timing runs in children)
        raise AssertionError(f"{bench} {' '.join(flags)} started a timing process")

    monkeypatch.setattr("multiprocessing.context.SpawnProcess.start", start)
    monkeypatch.setattr(sys, "argv", [f"{bench}.py", *flags])
    assert script_main(lambda: module.main(flags)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{bench}.py: error: ") and says in err, err


@pytest.mark.parametrize("bench", ["bench_members", "bench_sample"])
def test_run_as_a_user_runs_it_from_another_directory(tmp_path, bench):
    """The script itself (its `__main__`, the import of `_children` beside it), from another
    working directory by a relative path: one line, exit 2."""
    rel = os.path.relpath(BENCH / f"{bench}.py", tmp_path)
    r = subprocess.run([sys.executable, rel, "--steps" if bench == "bench_members" else "--new", "0"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{bench}.py: error: argument ")


@pytest.mark.parametrize("target,code", [(print, 0), (sys.exit, 1)], ids=["exit-0-without-result", "raises"])
def test_a_timing_process_that_ends_without_its_result_ends_the_benchmark(target, code):
    """`print(x, queue)` returns without putting a result (exit 0); `sys.exit(x, queue)` raises
    in the child (exit 1). Either way the parent stops waiting and names the exit code; run in
    its own process with a deadline, so a hang fails the test instead of hanging it."""
    code_line = (f"import sys, _children; _children.run_children('bench_x', {target.__module__}.{target.__name__}, "
                 "[('child',)])")
    mod = "builtins" if target is print else "sys"
    try:
        r = subprocess.run([sys.executable, "-c", f"import {mod}; {code_line}"], cwd=BENCH, capture_output=True,
                           text=True, timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("run_children still waiting 90 s after its child ended") from None
    assert r.returncode == 1
    assert f"bench_x: a timing process ended without its result (exit code {code})" in r.stderr
