"""benchmarks/bench_generate.py: batched recall generation against one request at a time, on
a run given by a relative path from the user's own directory, and its agreement check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from test_eval_adapter import eval_run  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, train_data_dir) -> Path:
    return eval_run(tmp_path_factory.mktemp("bench-gen") / "san", train_data_dir)


def test_it_times_both_modes_and_every_answer_agrees(load_benchmark, run_dir, monkeypatch, capsys):
    bg = load_benchmark("bench_generate")
    monkeypatch.chdir(run_dir.parent)
    assert bg.main(["--run", os.path.relpath(run_dir), "--rounds", "2", "--batch-size", "4", "--limit", "48"]) == 0
    out = capsys.readouterr().out
    n = int(out.split(" recall requests")[0].split()[-1])
    assert n > 0 and f"answers the same in both: {n} of {n}" in out, out
    buckets = int(out.split(" (context length, budget) buckets")[0].split()[-1])
    assert buckets < n  # some requests share a batch, so the agreement says something
    assert "batched (4 rows)" in out and "one at a time" in out


def test_answers_that_differ_fail_the_benchmark(load_benchmark, run_dir, monkeypatch, capsys):
    """Plant a batch that answers wrongly: the benchmark says how many agree and exits 1."""
    from sanlab.eval.adapter import SanlabLM

    bg = load_benchmark("bench_generate")
    real = SanlabLM._greedy_rows

    def wrong(self, jobs):
        texts = real(self, jobs)
        return [t + "!" for t in texts] if len(jobs) > 1 else texts

    monkeypatch.setattr(SanlabLM, "_greedy_rows", wrong)
    assert bg.main(["--run", str(run_dir), "--rounds", "1", "--batch-size", "4", "--limit", "24"]) == 1
    out = capsys.readouterr().out
    n = int(out.split(" recall requests")[0].split()[-1])
    assert f"answers the same in both: {n} of {n}" not in out


@pytest.mark.parametrize("args", [["--batch-size", "1"], ["--rounds", "0"], ["--limit", "0"], ["--run", "no/such/run"],
                                  ["--run", "x" * 300], ["--run", "loop"], ["--run", ""]])
def test_bad_input_is_one_line_and_exit_2(load_benchmark, tmp_path, monkeypatch, capsys, args):
    bg = load_benchmark("bench_generate")
    monkeypatch.chdir(tmp_path)
    Path("loop").symlink_to("loop")
    assert bg.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_generate: ") and "\n" not in err, err
