"""A study dir is relocatable: rerun with `--out` spelled differently, or after moving or
copying the dir, and every run is recognised as the same run (the run dir's config holds
no path that depends on where the study dir is)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sanlab.config import Config
from sanlab.errors import DataError
from sanlab.study.orchestrate import Study
from sanlab.study.runner import Job, train_in_process
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore

TRAIN_FN = "test_study_relocate:record_only"


def record_only(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """A stand-in trainer that keeps the real trainer's bookkeeping (`rundir.decide`: a run
    dir holding another config is refused) and needs its data dir, but trains nothing."""
    from sanlab.train import rundir

    out = Path(out_dir)
    if not (Path(cfg.data.dir) / "manifest.json").is_file():  # resolved like the trainer: from the cwd
        raise DataError(f"data.dir={cfg.data.dir}: no such directory (cwd {os.getcwd()})")
    decision = rundir.decide(out, cfg, resume=resume, force=force)
    if decision.action == "done":
        assert decision.meta is not None
        return decision.meta
    out.mkdir(parents=True, exist_ok=True)
    rundir.write_json(out / rundir.CONFIG_FILE, rundir.config_json(cfg))
    meta = {"status": "completed", "final": {"val_loss": 3.0 + cfg.model.n_layers * 0.01}}
    rundir.write_json(out / rundir.META_FILE, meta)
    with open(out.parent / "calls.txt", "a") as f:
        f.write(out.name + "\n")
    return meta


class InlineRunner:
    """The worker's code path (`train_in_process`: lock-free here, run dir as cwd) in this
    process: worker processes would only add their start-up time."""

    def run(self, jobs: list[Job], on_done: Any) -> None:
        for job in jobs:
            on_done(job, train_in_process(job))


def study(spec: StudySpec, out: Path) -> int:
    return Study(spec, out, train_fn=TRAIN_FN, runner=InlineRunner()).run()  # type: ignore[arg-type]


def _spec() -> StudySpec:
    return StudySpec.model_validate({
        "name": "reloc", "seeds": [1],
        # the study's own data: prepared into DIR/data (here: copied there beforehand)
        "data": {"corpus": "synth", "tokens": 20000, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_depth"]},
        "sweep": {"enabled": False}, "noise": {"enabled": False},
        "final": {"tokens": [2000]},
        "runner": {"workers": 2, "threads": 1},
    })


def _calls(study: Path) -> list[str]:
    f = study / "runs" / "calls.txt"
    return f.read_text().split() if f.is_file() else []


def test_moved_copied_or_respelled_study_dirs_resume_their_runs(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(study_data_dir, tmp_path / "a" / "data")
    assert study(_spec(), Path("a")) == 0  # --out a (relative)
    trained = sorted(_calls(tmp_path / "a"))
    assert len(trained) == 2
    records = ResultStore(tmp_path / "a").runs()
    assert {r["run_dir"] for r in records.values()} == {f"runs/{rid}" for rid in records}
    for rid in records:
        stored = json.loads((tmp_path / "a" / "runs" / rid / "config.json").read_text())
        assert stored["data"]["dir"] == os.path.join("..", "..", "data")

    # Without its store the study must ask every run dir again: each must say "finished,
    # same config", wherever the study dir now is and however --out is spelled.
    (tmp_path / "a" / "results.jsonl").unlink()
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert study(_spec(), tmp_path / "b") == 0  # moved, --out absolute
    assert sorted(_calls(tmp_path / "b")) == trained  # nothing trained again
    assert {r["status"] for r in ResultStore(tmp_path / "b").runs().values()} == {"completed"}

    shutil.copytree(tmp_path / "b", tmp_path / "nested" / "c")
    (tmp_path / "nested" / "c" / "results.jsonl").unlink()
    monkeypatch.chdir(tmp_path / "nested")
    assert study(_spec(), Path("./c/")) == 0  # copied, spelled ./c/
    assert sorted(_calls(tmp_path / "nested" / "c")) == trained
    assert len(ResultStore(tmp_path / "b").runs()) == 2  # the original is untouched by the copy's run


def test_external_data_is_recorded_absolute(study_data_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(study_data_dir, tmp_path / "shared-data")
    spec = _spec().model_copy(update={"data": _spec().data.model_copy(update={"dir": "shared-data",
                                                                                "corpus": None})})
    assert study(spec, Path("s")) == 0
    shutil.move(tmp_path / "s", tmp_path / "t")
    (tmp_path / "t" / "results.jsonl").unlink()
    assert study(spec, tmp_path / "t") == 0
    for rec in ResultStore(tmp_path / "t").runs().values():
        assert rec["config"]["data"]["dir"] == str(tmp_path / "shared-data")


CLI_SPEC = """name = "cwd"
seeds = [1]
[data]
dir = "mydata"
seq_len = 32
[model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[train]
batch_rows = 4
eval_every = 0
eval_rows = 8
milestones = [1.0]
precision = "fp32"
[matching]
arms = ["iso_depth"]
[sweep]
enabled = false
[noise]
enabled = false
[final]
tokens = [1024]
[runner]
workers = 1
threads = 1
"""


def test_study_run_from_a_working_directory_with_a_relative_out_and_data_dir(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sanlab study run SPEC --out REL` with the real trainer, whose runs train with their run
    dir as the working directory: the spec's relative `data.dir` is the caller's, and the
    table's numbers are the runs' own (Δ = arm − reference of their final val losses)."""
    from sanlab.cli import main
    from sanlab.study.results import table_json

    monkeypatch.chdir(tmp_path)
    shutil.copytree(study_data_dir, tmp_path / "mydata")
    (tmp_path / "spec.toml").write_text(CLI_SPEC)
    monkeypatch.setattr("sanlab.study.orchestrate.make_runner", lambda spec, d: InlineRunner())
    assert main(["study", "run", "spec.toml", "--out", "rel/study"]) == 0
    out = tmp_path / "rel" / "study"
    records = ResultStore(out).runs()
    assert len(records) == 2 and {r["status"] for r in records.values()} == {"completed"}
    losses = {}
    for rid in records:
        run = out / "runs" / rid
        assert json.loads((run / "config.json").read_text())["data"]["dir"] == str(tmp_path / "mydata")
        meta = json.loads((run / "meta.json").read_text())
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert meta["final"]["val_loss"] == [x for x in logged if x.get("val_loss") is not None][-1]["val_loss"]
        losses[rid] = meta["final"]["val_loss"]
    monkeypatch.chdir(tmp_path / "rel")  # the table read from elsewhere
    (gap,) = table_json(Path("study"))["gaps"]
    pair = gap["runs"]["1"]
    assert gap["per_seed"]["1"] == pytest.approx(losses[pair["arm"]] - losses[pair["reference"]], abs=1e-12)
