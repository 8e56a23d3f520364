"""The local runner's stream (`Study._stream`): a cell's next sweep points start as soon as
its last ones finish and its final runs as soon as it locks, with the same runs, locks and
results as round by round; and the runner's `more` and rank order underneath."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.study.orchestrate import Study
from sanlab.study.runner import Job, LocalRunner
from sanlab.study.spec import RunnerSpec
from sanlab.study.store import ResultStore

from test_study_orchestrate import make_spec
from test_study_warm import _jobs

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def _times(study: Path) -> dict[str, dict[str, float]]:
    lines = (study / "runs" / "times.jsonl").read_text().splitlines()
    return {r["run"]: r for r in map(json.loads, lines)}


def test_a_cell_that_locks_starts_its_final_runs_while_another_still_sweeps(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SAN's sweep points are fast and lock at once (optimum 1×); the iso-depth arm's
    are slow and need two boundary extensions (optimum 4×). The SAN's final runs start
    before the iso-depth sweep's last point ends; by rounds they would wait for it."""
    monkeypatch.setenv("SANLAB_FAKE_SECONDS_BY_KIND", "san=0.05,ffn=0.8")
    spec = make_spec(study_data_dir, matching={"arms": ["iso_depth"]}, runner={"workers": 2, "threads": 1, "members": 1})
    console = Console(record=True, width=200)
    assert Study(spec, tmp_path, console=console, train_fn="study_fakes:timed_train").run() == 0
    times = _times(tmp_path)
    records = ResultStore(tmp_path).runs()
    sweep_depth = [rid for rid, r in records.items() if r["arm"] == "iso_depth" and "sweep" in r["phases"]]
    san_finals = [rid for rid, r in records.items() if r["arm"] == "san" and "final" in r["phases"]]
    assert len(sweep_depth) == 5 and len(san_finals) == 2  # 0.5, 1, 2 and the extensions 4, 8
    assert min(times[r]["start"] for r in san_finals) < max(times[r]["end"] for r in sweep_depth)
    text = console.export_text()
    assert "sweep, boundary extension: 1 run(s) (iso_depth muon)" in text
    assert text.index("lock san muon") < text.index("lock iso_depth muon")
    assert text.count("lock san muon") == text.count("lock iso_depth muon") == 1


def _outcomes(study: Path) -> dict[str, tuple]:
    return {rid: (r["status"], r["phases"], r["lr"], (r.get("final") or {}).get("val_loss"))
            for rid, r in ResultStore(study).runs().items()}


def _locks(study: Path) -> dict:
    return {k: v["lr"] for k, v in ResultStore(study).locks().items()}


@pytest.mark.parametrize("extra", [{}, {"sweep": {"multipliers": [1.0, 32.0], "extend": False}},
                                   {"sweep": {"enabled": False}}],
                         ids=["extensions", "diverged-point", "no-sweep"])
def test_the_stream_runs_what_rounds_run(study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         extra: dict) -> None:
    """The same runs (ids, phases, LRs, statuses, losses) and the same locks, streamed or by rounds."""
    spec = make_spec(study_data_dir, runner={"workers": 2, "threads": 1, "members": 1}, **extra)
    assert Study(spec, tmp_path / "stream", console=Console(width=200), train_fn="study_fakes:train").run() == 0
    monkeypatch.setattr(LocalRunner, "streams", False)
    assert Study(spec, tmp_path / "rounds", console=Console(width=200), train_fn="study_fakes:train").run() == 0
    assert _outcomes(tmp_path / "stream") == _outcomes(tmp_path / "rounds")
    assert _locks(tmp_path / "stream") == _locks(tmp_path / "rounds")


@pytest.mark.parametrize("streams", [True, False], ids=["stream", "rounds"])
def test_without_a_sweep_one_line_names_the_base_lrs_before_any_run_and_no_lock_is_stored(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streams: bool) -> None:
    """`sweep.enabled = false`: nothing locks. One line, printed before the first run, says
    every cell trains at its base LR (the SAN's own base LR apart from the standard arms');
    no "lock" line and no lock record, which would read as a sweep's decision."""
    monkeypatch.setattr(LocalRunner, "streams", streams)
    spec = make_spec(study_data_dir, matching={"arms": ["iso_depth"]}, runner={"workers": 1, "threads": 1, "members": 1},
                     sweep={"enabled": False, "base_lr": {"san_muon": 0.03}})
    console = Console(record=True, width=300)
    assert Study(spec, tmp_path, console=console, train_fn="study_fakes:train").run() == 0
    text = console.export_text()
    line = "no LR sweep (sweep.enabled = false): every cell trains at its base LR: san muon 0.03, iso_depth muon 0.04"
    assert text.count(line) == 1
    assert text.index(line) < text.index("final + noise-floor runs")
    assert "lock " not in text
    assert ResultStore(tmp_path).locks() == {}
    lrs = {r["arm"]: r["lr"] for r in ResultStore(tmp_path).runs().values()}
    assert lrs == {"san": 0.03, "iso_depth": 0.04, "san_rms": 0.03}


def test_a_stream_resumes_from_its_store(study_data_dir: Path, tmp_path: Path) -> None:
    """A study whose store holds part of the sweep (as after a kill) runs only the rest,
    and the whole equals a study run in one go."""
    spec = make_spec(study_data_dir, runner={"workers": 2, "threads": 1, "members": 1})
    assert Study(spec, tmp_path / "whole", console=Console(width=200), train_fn="study_fakes:train").run() == 0
    part = tmp_path / "part"
    part.mkdir()
    lines = (tmp_path / "whole" / "results.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln).get("type") != "run" or "sweep" in json.loads(ln)["phases"]][:6]
    (part / "results.jsonl").write_text("".join(ln + "\n" for ln in kept))
    assert Study(spec, part, console=Console(width=200), train_fn="study_fakes:train").run() == 0
    assert _outcomes(part) == _outcomes(tmp_path / "whole")


def test_more_jobs_join_the_run_and_lower_ranks_start_first(tmp_path: Path) -> None:
    """One worker, so the finishing order is the starting order: rank 0 before rank 1
    whatever the cost, the costliest first within a rank, and a job `more` adds after the
    first one finishes starts before the waiting jobs of a higher rank."""
    a, b, c, d = _jobs(tmp_path, ["a", "b", "c", "d"])
    jobs = [Job(**{**a.__dict__, "cost": 5.0, "rank": 1}), Job(**{**b.__dict__, "cost": 9.0, "rank": 1}),
            Job(**{**c.__dict__, "cost": 1.0, "rank": 0})]
    order: list[str] = []
    extra = [Job(**{**d.__dict__, "cost": 0.5, "rank": 0})]

    def more() -> list[Job]:
        out, extra[:] = list(extra), []
        return out

    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    try:
        runner.run(jobs, lambda job, outcome: order.append(job.run_id), more=more)
    finally:
        runner.close()
    assert order == ["c", "d", "b", "a"]


def test_a_free_worker_takes_sweep_points_before_final_runs(study_data_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker. The SAN locks while the iso-depth sweep still extends; its final runs
    (2 s each at the SAN's measured 1,000 tokens/s) would go first by cost, but the
    iso-depth extensions (0.01 s) decide what runs next, so every sweep point starts first."""
    from test_study_orchestrate import calls

    monkeypatch.setenv("SANLAB_FAKE_TOKENS_PER_S", "san=1000,ffn=100000")
    spec = make_spec(study_data_dir, matching={"arms": ["iso_depth"]}, runner={"workers": 1, "threads": 1, "members": 1})
    assert Study(spec, tmp_path, console=Console(width=200), train_fn="study_fakes:train").run() == 0
    records = ResultStore(tmp_path).runs()
    order = calls(tmp_path)
    sweep = [i for i, rid in enumerate(order) if "sweep" in records[rid]["phases"]]
    final = [i for i, rid in enumerate(order) if "sweep" not in records[rid]["phases"]]
    assert len(sweep) == 8 and final and max(sweep) < min(final), order
