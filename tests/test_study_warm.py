"""Warm workers (`sanlab.study.warm`): a local runner's runs fork from processes that
imported torch and sanlab once, each run still its own process, the warm processes kept
across a study's rounds, a study's death still stopping its runs, and the cold path
(`SANLAB_WARM_WORKERS=0`, or a warm process that died) giving the same outcomes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sanlab.config import load_config
from sanlab.study.runner import Job, LocalRunner
from sanlab.study.spec import RunnerSpec

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def _jobs(root: Path, names: list[str]) -> list[Job]:
    cfg = json.loads(load_config(None, ["model.d_model=32", "model.n_layers=2"]).model_dump_json())
    return [Job(run_id=n, run_dir=str(root / "runs" / n), config=cfg, jobs_dir=str(root / "jobs"),
                train_fn="study_fakes:process_train") for n in names]


def _run(runner: LocalRunner, jobs: list[Job]) -> dict[str, dict]:
    outcomes: dict[str, dict] = {}
    runner.run(jobs, lambda job, outcome: outcomes.__setitem__(job.run_id, outcome))
    assert all(o["status"] == "completed" for o in outcomes.values()), outcomes
    return {j.run_id: json.loads((Path(j.run_dir) / "process.json").read_text()) for j in jobs}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_runs_fork_from_warm_processes_kept_across_rounds(tmp_path: Path) -> None:
    runner = LocalRunner(RunnerSpec(workers=2, threads=1, members=1))
    try:
        first = _run(runner, _jobs(tmp_path, ["a", "b", "c"]))
        second = _run(runner, _jobs(tmp_path, ["d", "e"]))  # a study's next round
    finally:
        runner.close()
    procs = {**first, **second}
    warm = {p["ppid"] for p in procs.values()}
    assert os.getpid() not in warm and len(warm) <= 2  # not started by the runner: forked
    assert {p["ppid"] for p in second.values()} <= {p["ppid"] for p in first.values()}  # the same warm processes
    assert len({p["pid"] for p in procs.values()}) == 5  # each run its own process
    assert all(p["preloaded"] and p["threads"] == 1 and not p["sigint_ignored"] for p in procs.values())
    # the imports were frozen out of the collector's reach, which is on again for the run
    assert all(p["gc_frozen"] > 100_000 and p["gc_enabled"] for p in procs.values())
    assert all(p["parent_env"] == str(p["ppid"]) for p in procs.values())  # dies with its warm process
    deadline = time.time() + 10
    while any(_alive(pid) for pid in warm) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in warm)  # close() stopped them


def test_cold_runs_when_warm_workers_are_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANLAB_WARM_WORKERS", "0")
    runner = LocalRunner(RunnerSpec(workers=2, threads=1, members=1))
    try:
        procs = _run(runner, _jobs(tmp_path, ["a", "b"]))
    finally:
        runner.close()
    assert all(p["ppid"] == os.getpid() and p["parent_env"] == str(os.getpid()) for p in procs.values())
    assert all(p["gc_frozen"] == 0 and p["gc_enabled"] for p in procs.values())


def test_a_dead_warm_process_leaves_its_runs_to_new_processes(tmp_path: Path) -> None:
    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    try:
        first = _run(runner, _jobs(tmp_path, ["a"]))
        os.kill(first["a"]["ppid"], signal.SIGKILL)
        time.sleep(0.2)
        second = _run(runner, _jobs(tmp_path, ["b", "c"]))
    finally:
        runner.close()
    assert first["a"]["ppid"] != os.getpid()
    assert all(p["ppid"] == os.getpid() for p in second.values())


# A study in a process of its own: the local runner (1 worker) on runs of `process_train`
# named by its second argument's letters; exit 130 on KeyboardInterrupt, as the CLI.
STUDY = """\
import json, sys
from pathlib import Path
from sanlab.config import load_config
from sanlab.study.runner import Job, LocalRunner
from sanlab.study.spec import RunnerSpec
root = Path(sys.argv[1])
cfg = json.loads(load_config(None, []).model_dump_json())
jobs = [Job(run_id=n, run_dir=str(root / 'runs' / n), config=cfg, jobs_dir=str(root / 'jobs'),
            train_fn='study_fakes:process_train') for n in sys.argv[2]]
runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
try:
    runner.run(jobs, lambda j, o: None)
except KeyboardInterrupt:
    sys.exit(130)
finally:
    runner.close()
"""


def _study_running(tmp_path: Path, names: str, **env: str) -> tuple[subprocess.Popen[bytes], dict]:
    """`STUDY` started in its own session (a terminal's foreground job), once run a is
    under way (each run waits 60 s): the process, and run a's process.json."""
    script = tmp_path / "study.py"
    script.write_text(STUDY)
    study = subprocess.Popen([sys.executable, str(script), str(tmp_path), names],
                             env={**os.environ, "SANLAB_FAKE_SECONDS": "60", **env}, start_new_session=True)
    marker = tmp_path / "runs" / "a" / "process.json"
    deadline = time.time() + 60
    while not marker.is_file():
        assert study.poll() is None and time.time() < deadline
        time.sleep(0.05)
    return study, json.loads(marker.read_text())


def test_killing_the_study_process_stops_its_forked_runs(tmp_path: Path) -> None:
    """SIGKILL to the study process alone: its warm process gets SIGTERM (PR_SET_PDEATHSIG),
    and so does the run forked from it, as a run started directly by the study did."""
    study, run = _study_running(tmp_path, "a")
    assert run["ppid"] != study.pid  # forked from the warm process
    study.kill()
    study.wait()
    deadline = time.time() + 20
    while (_alive(run["pid"]) or _alive(run["ppid"])) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(run["pid"]) and not _alive(run["ppid"])


def test_the_costliest_runs_start_first(tmp_path: Path) -> None:
    """Longest first, as `study plan`'s estimate assumes (`plan.makespan`); runs of unknown
    cost (0) keep their order."""
    jobs = [Job(**{**j.__dict__, "cost": c}) for j, c in zip(_jobs(tmp_path, ["a", "b", "c", "d"]), [1e9, 3e9, 0, 2e9])]
    order: list[str] = []
    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    try:
        runner.run(jobs, lambda job, outcome: order.append(job.run_id))
        assert order == ["b", "d", "a", "c"]
        order.clear()
        runner.run(_jobs(tmp_path / "unknown", ["x", "y", "z"]), lambda job, outcome: order.append(job.run_id))
        assert order == ["x", "y", "z"]
    finally:
        runner.close()


def test_a_runner_left_unclosed_stops_its_warm_processes_when_collected(tmp_path: Path) -> None:
    import gc

    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    warm = _run(runner, _jobs(tmp_path, ["a"]))["a"]["ppid"]
    del runner
    gc.collect()
    deadline = time.time() + 10
    while _alive(warm) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(warm)


@pytest.mark.parametrize("warm", ["1", "0"])
def test_ctrl_c_stops_the_running_runs_and_starts_no_more(tmp_path: Path, warm: str) -> None:
    """SIGINT to the study's process group (Ctrl-C): the running run gets it too and stops;
    the runs still queued never start, and the runner raises KeyboardInterrupt at once.
    (Leaving the thread pool's `with` block used to start every queued run first.)"""
    study, _ = _study_running(tmp_path, "abc", SANLAB_WARM_WORKERS=warm)
    os.killpg(study.pid, signal.SIGINT)
    assert study.wait(timeout=30) == 130
    assert not (tmp_path / "runs" / "b").exists() and not (tmp_path / "runs" / "c").exists()


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_study_that_ignores_ctrl_c_gives_its_runs_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             warm: str) -> None:
    """A study started with SIGINT ignored (a shell's background job): its runs ignore it
    too, forked from a warm process (which ignores SIGINT itself) as started afresh."""
    monkeypatch.setenv("SANLAB_WARM_WORKERS", warm)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
        try:
            procs = _run(runner, _jobs(tmp_path, ["a"]))
        finally:
            runner.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert procs["a"]["sigint_ignored"] and (procs["a"]["ppid"] != os.getpid()) == (warm == "1")


def test_a_study_starts_its_warm_processes_before_it_prepares_its_data(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Their imports (~2.4 s) overlap the data's preparation instead of following it."""
    import shutil

    from test_study_relocate import TRAIN_FN, InlineRunner, _spec

    from sanlab.study import orchestrate

    events: list[str] = []

    class Runner(InlineRunner):
        def warm_up(self) -> None:
            events.append("warm_up")

        def run(self, jobs: list[Job], on_done: object) -> None:
            events.append("run")
            super().run(jobs, on_done)

    resolve = orchestrate.resolve_data

    def recorded(*args: object, **kwargs: object) -> object:
        if kwargs.get("prepare"):  # (the checks before it read the data without preparing it)
            events.append("prepare")
        return resolve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(orchestrate, "resolve_data", recorded)
    shutil.copytree(study_data_dir, tmp_path / "s" / "data")
    assert orchestrate.Study(_spec(), tmp_path / "s", train_fn=TRAIN_FN, runner=Runner()).run() == 0  # type: ignore[arg-type]
    assert events[:3] == ["warm_up", "prepare", "run"]


def test_a_warm_process_never_asked_to_run_is_stopped_at_once(tmp_path: Path) -> None:
    """`close` kills a warm process that never forked a run (a study with nothing left to
    run need not wait for its imports); one that did ends on its own when its stdin closes."""
    idle = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    idle.warm_up()
    assert idle._warm is not None
    proc = idle._warm.queue[0].proc
    idle.close()
    assert proc.returncode == -signal.SIGKILL
    used = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    used.warm_up()
    assert used._warm is not None
    proc = used._warm.queue[0].proc
    _run(used, _jobs(tmp_path, ["a"]))
    used.close()
    assert proc.returncode == 0


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_worker_that_fails_gives_its_exit_code_and_traceback_warm_or_cold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: str) -> None:
    """A worker that dies before it writes an outcome (here: its job file is missing) is
    reported by its exit code, with its traceback in the run's log, the same forked from a
    warm process as started cold (the outcome: "worker exited with code 1 (see LOG)")."""
    import subprocess as sp

    monkeypatch.setenv("SANLAB_WARM_WORKERS", warm)
    runner = LocalRunner(RunnerSpec(workers=1, threads=1, members=1))
    if warm == "1":  # (the run must fork from the warm process, not fall back to a new one)
        monkeypatch.setattr(sp, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started cold")))
    log = tmp_path / "run.log"
    try:
        runner._start_warm()
        rc = runner._launch("sanlab.study.runner", [str(tmp_path / "missing.json"), str(tmp_path / "out.json")],
                            log, {"OMP_NUM_THREADS": "1"})
    finally:
        runner.close()
    assert rc == 1
    assert "Traceback" in log.read_text() and "FileNotFoundError" in log.read_text()
