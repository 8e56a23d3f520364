"""A study as a user drives it from the command line, from a working directory of their
own with relative paths: token counts read alike everywhere, an override means what the
same text means in the spec file, a study dir runs the one study it was made with
(`--extend` adds runs, never changes one), and `report` and `study status` count the
same runs."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.config import Config, load_config
from sanlab.study.orchestrate import Study
from sanlab.study.spec import load_spec
from sanlab.study.store import ResultStore

TESTS = Path(__file__).parent

SPEC = """name = "usage"
seeds = [1]
[data]
dir = "data"
seq_len = 32
[model]
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[matching]
arms = ["iso_depth"]
policy = "nearest"
tolerance = 0.5
[sweep]
tokens = "1K"
multipliers = [0.5, 1, 2]
max_extensions = 4
[final]
tokens = ["2K"]
[runner]
workers = 1
threads = 1
"""


@pytest.fixture
def home(study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's working directory: the spec and a prepared `data/` side by side; studies
    run with the stand-in trainer (tests/study_fakes.py)."""
    shutil.copytree(study_data_dir, tmp_path / "data")
    (tmp_path / "spec.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr("sanlab.commands.study.Study", functools.partial(Study, train_fn="study_fakes:train"))
    return tmp_path


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _calls(study: Path) -> list[str]:
    path = study / "runs" / "calls.txt"
    return path.read_text().split() if path.is_file() else []


# --------------------------------------------------------------------------- token counts


TOKEN_KEYS = {  # key -> how the spec file writes 30K there
    "sweep.tokens": ('tokens = "1K"', 'tokens = "30K"'),
    "final.tokens": ('tokens = ["2K"]', 'tokens = ["30K"]'),
    "data.tokens": ('dir = "data"', 'dir = "data"\ncorpus = "synth"\ntokens = "30K"'),
    "noise.tokens": ("[runner]", '[noise]\ntokens = "30K"\n[runner]'),
}


@pytest.mark.parametrize("key", list(TOKEN_KEYS))
def test_a_study_token_count_reads_alike_in_the_file_and_on_the_command_line(home: Path, key: str) -> None:
    old, new = TOKEN_KEYS[key]
    Path("file.toml").write_text(SPEC.replace(old, new, 1))
    section, name = key.split(".")
    listed = key == "final.tokens"
    from_file = getattr(getattr(load_spec("file.toml"), section), name)
    assert from_file == ([30_000] if listed else 30_000)
    for raw in ("30K", "30k", "30_000", "3e4", "30000", "0.03M"):
        from_cli = getattr(getattr(load_spec("spec.toml", [f"{key}={f'[{raw}]' if listed else raw}"]), section), name)
        assert from_cli == from_file, raw


def test_train_tokens_read_alike_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("run.toml").write_text('[train]\ntokens = "2M"\n')
    assert load_config("run.toml").train.tokens == load_config(None, ["train.tokens=2M"]).train.tokens == 2_000_000
    assert isinstance(load_config(None, ["train.tokens=2.5M"]), Config)


def test_sweep_tokens_override_plans(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "plan", "spec.toml", "sweep.tokens=30K", "--json", "--no-timing"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {r["tokens"] for r in plan["runs"] if "sweep" in r["phases"]} == {30_000}


# --------------------------------------------------------------------------- an override is a file's value


AXIS = SPEC.replace('[data]\ndir = "data"\nseq_len = 32\n',
                    '[data]\ncorpus = "synth"\ntokens = "20K"\nseq_len = 32\naxis = {"synth.facts" = [400, 1600]}\n')


def test_lock_at_override_means_what_the_file_means(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("axis.toml").write_text(AXIS)
    Path("axis_lock.toml").write_text(AXIS.replace('tokens = "1K"', 'tokens = "1K"\nlock_at = 400'))
    assert load_spec("axis.toml", ["sweep.lock_at=400"]).sweep.lock_at == load_spec("axis_lock.toml").sweep.lock_at == 400
    plans = []
    for argv in (["axis.toml", "sweep.lock_at=400"], ["axis_lock.toml"]):
        assert main(["study", "plan", *argv, "--json", "--no-timing"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0] == plans[1]
    assert {r["data"] for r in plans[0]["runs"] if "sweep" in r["phases"]} == {"facts400"}


# --------------------------------------------------------------------------- a study dir is one study


def test_a_study_dir_refuses_another_spec_and_rewrites_nothing(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    done = _calls(Path("runs/s"))
    assert done
    before = _tree(home)
    capsys.readouterr()
    for overrides, keys in ((["sweep.tokens=2K"], "sweep.tokens"),
                            (["model.d_model=64", "optim.weight_decay=0.5"], "model.d_model, optim.weight_decay"),
                            (["sweep.multipliers=[1,2,4]"], "sweep.multipliers"),
                            (["arms=[{name='extra', model={n_layers=2}}]"], None)):
        for extend in ([], ["--extend"]):
            rc = main(["study", "run", "spec.toml", *overrides, "--out", "runs/s", *extend])
            err = capsys.readouterr().err.strip().splitlines()
            if keys is None and extend:  # a new arm is an extension
                assert rc == 0
                continue
            assert rc == 2 and len(err) == 1, (overrides, extend, err)
            assert (keys or "arms") in err[0] and "runs/s" in err[0], err[0]
            assert ("--extend" in err[0]), err[0]
            assert _tree(home) == before, "the study dir was rewritten"


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "by-rounds"])
def test_a_store_whose_sweep_points_read_as_other_runs_is_one_line_not_an_endless_sweep(
        home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, streams: bool) -> None:
    """A results.jsonl edited so that finished sweep points no longer read as sweep points
    (their phases rewritten): the sweep wants them, finds them finished and runs nothing,
    and would plan them again every round, forever. The study stops at once with one line
    naming the store and a run, exit 2, and writes nothing: streamed (the local runner) and
    by rounds (the SLURM runner's way)."""
    from sanlab.study.runner import LocalRunner

    monkeypatch.setattr(LocalRunner, "streams", streams)
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    store = Path("runs/s/results.jsonl")
    records = [json.loads(line) for line in store.read_text().splitlines()]
    edited = [r["run_id"] for r in records if r.get("type") == "run" and r.get("phases") == ["sweep"]
              and r.get("multiplier") == 1.0]
    assert edited
    for r in records:
        if r.get("run_id") in edited:
            r["phases"] = ["final"]
    store.write_text("".join(json.dumps(r) + "\n" for r in records))
    before = _tree(home)
    capsys.readouterr()
    result: list[int] = []
    study = threading.Thread(target=lambda: result.append(main(["study", "run", "spec.toml", "--out", "runs/s"])),
                             daemon=True)
    study.start()
    study.join(timeout=60)
    assert not study.is_alive(), "the sweep went round and round"
    err = capsys.readouterr().err.strip().splitlines()
    assert result == [2] and len(err) == 1, err
    assert "runs/s/results.jsonl" in err[0] and any(rid in err[0] for rid in edited), err[0]
    assert _tree(home) == before


def test_extend_adds_seeds_budgets_and_arms_and_keeps_every_finished_run(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    first = _calls(Path("runs/s"))
    # the same spec again: every finished run reused, nothing trained
    assert main(["study", "run", "spec.toml", "--out", "runs/s", "runner.workers=2"]) == 0
    assert _calls(Path("runs/s")) == first
    grow = ["seeds=[1,2]", "final.tokens=[2K,4K]", "noise.tokens=2K", "arms=[{name='extra', model={n_layers=2}}]"]
    capsys.readouterr()
    assert main(["study", "run", "spec.toml", *grow, "--out", "runs/s"]) == 2
    assert "--extend" in capsys.readouterr().err
    assert main(["study", "run", "spec.toml", *grow, "--out", "runs/s", "--extend"]) == 0
    new = _calls(Path("runs/s"))[len(first):]
    assert new and not set(new) & set(first)  # only new runs trained
    assert all(("-s2" in r) or ("-4K-" in r) or r.startswith("extra-") for r in new), new
    records = ResultStore("runs/s").runs()
    assert set(first) <= set(records)
    # status lists the old runs with the new ones, every one completed
    capsys.readouterr()
    assert main(["study", "status", "runs/s", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {r["run_id"] for r in status["runs"]} >= set(first)
    assert status["counts"] == {"completed": len(status["runs"])}


def test_extend_refuses_moving_the_noise_pair(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    capsys.readouterr()
    assert main(["study", "run", "spec.toml", "final.tokens=[2K,4K]", "--out", "runs/s", "--extend"]) == 2
    err = capsys.readouterr().err
    assert "noise.tokens" in err and "2000" in err


# --------------------------------------------------------------------------- report and status agree


def test_report_and_status_count_the_same_runs_without_a_results_store(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    Path("runs/s/results.jsonl").unlink()
    capsys.readouterr()
    assert main(["study", "status", "runs/s", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts.get("completed", 0) > 0
    assert main(["report", "runs/s"]) == 0
    page = Path(capsys.readouterr().out.strip().splitlines()[-1]).read_text()
    assert "0 runs" not in page and "no run finished yet" not in page
    assert f"{counts['completed']} completed" in page
