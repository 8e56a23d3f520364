"""End to end with the real trainer: the runner drives `sanlab.train.trainer.train`, a
killed `study run` loses no finished result and a rerun completes without redoing them,
and the SLURM runner path works through submitit's local executor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sanlab.study.plan import build_arms, final_runs
from sanlab.study.runner import Job, LocalRunner, SlurmRunner
from sanlab.study.spec import RunnerSpec, StudySpec
from sanlab.study.store import ResultStore

TESTS = Path(__file__).parent


@pytest.fixture
def data_dir(study_data_dir: Path) -> Path:
    return study_data_dir


SPEC = """
name = "e2e"
seeds = [1]
[data]
dir = "{data}"
seq_len = 32
[model]
d_model = 32
n_layers = 5
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[train]
batch_rows = 8
eval_every = 0
eval_rows = 8
log_every = 1
checkpoint_every = 2
milestones = [1.0]
precision = "fp32"
[matching]
arms = ["iso_param"]
[sweep]
tokens = 1024
multipliers = [1, 2]
extend = false
[final]
tokens = [2048]
[runner]
workers = 2
threads = 1
"""


def _spec(data_dir: Path) -> StudySpec:
    import tomllib

    return StudySpec.model_validate(tomllib.loads(SPEC.format(data=data_dir)))


def test_runner_drives_the_real_trainer_and_never_retrains(data_dir: Path, tmp_path: Path) -> None:
    spec = _spec(data_dir)
    run = final_runs(spec, build_arms(spec), {("san", "muon"): 0.02}, str(data_dir))[0]
    job = Job(run_id=run.run_id, run_dir=str(tmp_path / "runs" / run.run_id),
              config=json.loads(run.config.model_dump_json()), jobs_dir=str(tmp_path / "jobs"))
    runner = LocalRunner(RunnerSpec(workers=1, threads=1))
    outcomes: list[dict] = []
    runner.run([job], lambda j, o: outcomes.append(o))
    assert outcomes[0]["status"] == "completed", outcomes[0]
    assert outcomes[0]["final"]["val_loss"] > 0 and outcomes[0]["final"]["tokens"] == 2048
    meta = json.loads((Path(job.run_dir) / "meta.json").read_text())
    runner.run([job], lambda j, o: outcomes.append(o))
    runner.close()
    assert outcomes[1]["final"] == outcomes[0]["final"]
    assert json.loads((Path(job.run_dir) / "meta.json").read_text())["finished_at"] == meta["finished_at"]


def test_slurm_runner_through_submitit_local_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    from sanlab.config import Config

    runner = SlurmRunner(RunnerSpec(kind="slurm", threads=1, slurm={"local": True, "time_min": 5}),
                         tmp_path / "slurm")
    jobs = [Job(run_id=f"r{i}", run_dir=str(tmp_path / "runs" / f"r{i}"),
                config=json.loads(Config(optim={"lr": lr}).model_dump_json()),
                jobs_dir=str(tmp_path / "jobs"), train_fn="study_fakes:train")
            for i, lr in enumerate([0.02, 0.02 * 64])]
    outcomes: dict[str, dict] = {}
    runner.run(jobs, lambda j, o: outcomes.__setitem__(j.run_id, o))
    assert outcomes["r0"]["status"] == "completed" and outcomes["r0"]["final"]["val_loss"] > 0
    assert outcomes["r1"]["status"] == "diverged"


def _study(spec_path: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "sanlab", "study", "run", str(spec_path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_killed_study_resumes_without_redoing_finished_runs(data_dir: Path, tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC.format(data=data_dir))
    out = tmp_path / "study"
    store = ResultStore(out)

    proc = _study(spec_path, out)
    deadline = time.time() + 300
    while not any(r["status"] == "completed" for r in store.runs().values()):
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {rid: r for rid, r in store.runs().items() if r["status"] == "completed"}
    finished_at = {rid: json.loads((out / "runs" / rid / "meta.json").read_text())["finished_at"]
                   for rid in done_before}
    assert done_before

    rerun = _study(spec_path, out)
    text = rerun.communicate(timeout=600)[0].decode()
    assert rerun.returncode == 0, text
    records = [r for r in store.records() if r.get("type") == "run"]
    runs = store.runs()
    # 4 sweep points, 2 final runs (the SAN one shared with nothing at 2K), 1 rms noise run.
    assert len(runs) == 7 and all(r["status"] == "completed" for r in runs.values())
    for rid in done_before:
        assert sum(r["run_id"] == rid for r in records) == 1  # never run again
        meta = json.loads((out / "runs" / rid / "meta.json").read_text())
        assert meta["finished_at"] == finished_at[rid]
    assert "Gap to the reference" in text and "noise floor" in text
