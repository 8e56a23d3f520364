"""Side tasks on idle workers (`runner.SideTask`, `Study(side_work=...)`, `study run
--report`): the local runner starts them on workers no job waits for, alongside the
runs; a study hands it each final pair group's analysis (`sanlab.report.analyze_job`)
once every final run of the group has completed, so the report after the study finds it
done, with the losses the report's own analysis gives."""

from __future__ import annotations

import json
from datetime import datetime
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.cli import main
from sanlab.report.analyze_job import side_work
from sanlab.report.cli import make_report
from sanlab.study.orchestrate import Study
from sanlab.study.runner import LocalRunner, SideTask
from sanlab.study.spec import RunnerSpec, StudySpec

from test_study_warm import _jobs
from torch_block import BLOCK_TORCH

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def _side(tmp_path: Path, name: str, rc: int, seconds: float, done: dict[str, int]) -> SideTask:
    return SideTask(name, "side_fake", (str(tmp_path / f"{name}.json"), str(rc), str(seconds)),
                    tmp_path / "jobs" / f"{name}.log", lambda code: done.__setitem__(name, code))


def test_side_tasks_take_the_free_workers_beside_a_run_and_run_waits_for_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers, one slow run: `idle` is asked for one task (one worker is free) while
    the run trains, and that task runs beside it; `idle` is asked again as workers free
    up; `run` returns only after the last task, each task's exit code to its `on_done`."""
    monkeypatch.setenv("SANLAB_WARM_WORKERS", "0")  # (side_fake is not a warm entry point)
    monkeypatch.setenv("SANLAB_FAKE_SECONDS", "2")
    asked: list[int] = []
    done: dict[str, int] = {}
    queue = [_side(tmp_path, "a", 0, 0.0, done), _side(tmp_path, "b", 3, 0.5, done)]

    def idle(free: int) -> list[SideTask]:
        asked.append(free)
        return [queue.pop(0)] if queue else []

    outcomes: dict[str, dict] = {}
    runner = LocalRunner(RunnerSpec(workers=2, threads=1, members=1))
    try:
        jobs = _jobs(tmp_path, ["slow"])
        runner.run(jobs, lambda job, o: outcomes.__setitem__(job.run_id, o), idle=idle)
    finally:
        runner.close()
    assert outcomes["slow"]["status"] == "completed"
    assert done == {"a": 0, "b": 3}
    assert asked[0] == 1  # asked while the run held the other worker
    run_start = (Path(jobs[0].run_dir) / "process.json").stat().st_mtime  # (written as the run starts)
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a["start"] < b["start"] and a["ppid"] == os.getpid()  # (cold: a child of this process)
    # both side tasks ran while the 2-s run trained (it ended after b began)
    assert b["start"] < run_start + 2.0


def test_a_side_task_that_cannot_start_is_an_exit_code_not_an_error(tmp_path: Path) -> None:
    """Its log's folder is a file: exit 126 to its `on_done`, and `run` goes on."""
    (tmp_path / "jobs").write_text("")
    done: dict[str, int] = {}
    tasks = [_side(tmp_path, "a", 0, 0.0, done)]
    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    try:
        runner.run([], lambda job, o: None, idle=lambda free: [tasks.pop()] if tasks else [])
    finally:
        runner.close()
    assert done == {"a": 126}


def test_no_side_task_starts_while_a_job_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker and three runs: `idle` is first asked once no run waits (the last one
    running), never with more free workers than there are."""
    monkeypatch.setenv("SANLAB_WARM_WORKERS", "0")
    asked: list[tuple[int, int]] = []
    finished: list[str] = []

    def idle(free: int) -> list[SideTask]:
        asked.append((free, len(finished)))
        return []

    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    try:
        runner.run(_jobs(tmp_path, ["a", "b", "c"]), lambda job, o: finished.append(job.run_id), idle=idle)
    finally:
        runner.close()
    assert len(finished) == 3 and asked == [(1, 3)]  # only after the last run: the one worker was busy till then


SPEC = {
    "name": "side", "seeds": [1, 2], "optimizers": ["muon"],
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
    "train": {"batch_rows": 4, "eval_every": 0, "eval_rows": 4, "milestones": [0.0, 1.0], "precision": "fp32"},
    "matching": {"arms": ["iso_param", "iso_depth"], "policy": "nearest", "tolerance": 10.0},
    "sweep": {"enabled": False}, "final": {"tokens": [1024]},
    "runner": {"workers": 2, "threads": 1, "members": 1},
}


def _toml(spec: dict) -> str:
    lines = []
    for k, v in spec.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {json.dumps(v)}")
    for k, v in spec.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_study_run_report_analyses_each_finished_group_on_an_idle_worker(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`sanlab study run SPEC --out study --report`, as a user runs it (a relative --out):
    SAN vs iso-param and iso-depth, two seeds, a noise pair. Each seed's group is analysed
    by a side task once its three final runs have completed (every arm: a group analysed
    with one missing would be analysed again), and the report after the study has nothing
    left to analyse. The side task's losses are the ones the report's own analysis gives."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text(_toml({**SPEC, "data": {"dir": str(study_data_dir), "seq_len": 32}}))
    assert main(["study", "run", "spec.toml", "--out", "study", "--report"]) == 0
    text = capsys.readouterr().out
    study = Path("study")
    groups = ["final-muon-1024-s1", "final-muon-1024-s2"]
    for g in groups:
        assert (study / "jobs" / f"analysis-{g}.log").is_file()
        a = json.loads((study / "analysis" / g / "analysis.json").read_text())
        assert len(a["runs"]) == 3 and len(a["comparisons"]) == 2
    assert text.count("(on an idle worker)") == 2 and "failed on an idle worker" not in text
    assert text.index("(on an idle worker)") < text.index("Gap to the reference")
    assert "analysing" not in text  # (the report found both done)
    assert text.rstrip().endswith("study/report/report.html")

    # the same groups analysed by the report itself, in this process
    side = {g: json.loads((study / "analysis" / g / "analysis.json").read_text()) for g in groups}
    shutil.rmtree(study / "analysis")

    # the study's process picks the side tasks without torch (its workers import it)
    code = (BLOCK_TORCH + "from pathlib import Path\n"
            "from sanlab.report.analyze_job import side_work\n"
            "from sanlab.study.orchestrate import Study\n"
            "from sanlab.study.spec import load_spec\n"
            "s = Study(load_spec('spec.toml', []), 'study', side_work=side_work(Path('study')))\n"
            "s.check()\n"
            "print(sorted(t.name[len('analysis-'):] for t in s._idle_tasks()(2)))\n"
            "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, f"{groups}\n"), proc.stderr
    log: list[str] = []
    make_report(study, analyze=True, log=log.append)
    assert log[0] == "analysing 2 group(s) of final runs (`sanlab analyze ARM… --vs REFERENCE`)"
    for g in groups:
        own = json.loads((study / "analysis" / g / "analysis.json").read_text())
        assert side[g]["comparisons"] == own["comparisons"] and side[g]["sample"] == own["sample"]
        assert {r: v["losses"] for r, v in side[g]["runs"].items()} == {r: v["losses"] for r, v in own["runs"].items()}


def test_a_group_waits_for_its_last_arm_while_a_worker_idles(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One seed, no noise pair: the SAN's and iso-param's final runs finish while the
    iso-depth one still trains (it waits 4 s first), so a worker idles with the group two
    thirds done. Its analysis starts only after the iso-depth run has finished, and covers
    all three runs."""
    monkeypatch.setenv("SANLAB_FAKE_DEEP_SECONDS", "4")
    spec = StudySpec.model_validate({**SPEC, "seeds": [1], "noise": {"enabled": False},
                                     "data": {"dir": str(study_data_dir), "seq_len": 32}})
    console = Console(record=True, width=400)
    assert Study(spec, tmp_path, console=console, train_fn="study_fakes:slow_deep_train",
                 side_work=side_work(tmp_path)).run() == 0
    a = json.loads((tmp_path / "analysis" / "final-muon-1024-s1" / "analysis.json").read_text())
    assert len(a["runs"]) == 3 and len(a["comparisons"]) == 2
    depth = next((tmp_path / "runs").glob("iso_depth-*"))
    ended = datetime.fromisoformat(json.loads((depth / "meta.json").read_text())["finished_at"]).timestamp()
    log = tmp_path / "jobs" / "analysis-final-muon-1024-s1.log"
    assert log.stat().st_ctime > ended  # (the log is created as the side task starts)
    assert console.export_text().count("(on an idle worker)") == 1


def test_no_side_analyses_without_the_report_or_on_gpus(study_data_dir: Path, tmp_path: Path) -> None:
    data = {"data": {"dir": str(study_data_dir), "seq_len": 32}}
    spec = StudySpec.model_validate({**SPEC, **data})
    assert Study(spec, tmp_path / "a")._idle_tasks() is None
    assert Study(spec, tmp_path / "b", side_work=side_work(tmp_path / "b"))._idle_tasks() is not None
    gpu = StudySpec.model_validate({**SPEC, **data, "runner": {"workers": 1, "gpus_per_run": 1}})
    assert Study(gpu, tmp_path / "c", side_work=side_work(tmp_path / "c"))._idle_tasks() is None
