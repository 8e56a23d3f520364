"""The study orchestration with a stand-in trainer (tests/study_fakes.py): sweep rounds,
boundary extension, locks, final and noise runs, the store, reruns and failing runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.config import Config
from sanlab.study.orchestrate import Study
from sanlab.study.plan import build_arms
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore
from sanlab.study.table import gaps, locks, sweep_rows

import study_fakes

TESTS = Path(__file__).parent


@pytest.fixture
def data_dir(study_data_dir: Path) -> Path:
    return study_data_dir


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes import the stand-in trainer from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def make_spec(data_dir: Path, **extra: object) -> StudySpec:
    raw = {
        "name": "fake", "seeds": [1, 2], "optimizers": ["muon"],
        "data": {"dir": str(data_dir), "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"policy": "nearest", "tolerance": None},
        "sweep": {"tokens": 1000, "max_extensions": 4},
        "final": {"tokens": [2000]},
        "runner": {"workers": 2, "threads": 1},
    }
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value  # type: ignore[dict-item]
    return StudySpec.model_validate(raw)


def calls(study_dir: Path) -> list[str]:
    path = study_dir / "runs" / "calls.txt"
    return path.read_text().split() if path.is_file() else []


def test_full_study_sweeps_locks_and_tabulates(data_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec(data_dir)
    console = Console(record=True, width=200)
    assert Study(spec, tmp_path, console=console, train_fn="study_fakes:train").run() == 0

    records = ResultStore(tmp_path).runs()
    arms = build_arms(spec)
    rows = {r.arm: r for r in sweep_rows(spec, arms, records)}
    # SAN optimum at 1× its base LR; the standard arms' at 4×, found by extending right.
    assert sorted(rows["san"].losses) == [0.5, 1.0, 2.0] and rows["san"].lock == 0.02
    for name in ("iso_param", "iso_flop", "iso_depth"):
        assert sorted(rows[name].losses) == [0.5, 1.0, 2.0, 4.0, 8.0]
        assert rows[name].lock == pytest.approx(0.16) and not rows[name].at_edge
    assert {k[0] for k in ResultStore(tmp_path).locks()} == {"san", "iso_param", "iso_flop", "iso_depth"}

    # Every final run and the noise pair finished; the gaps are the known differences.
    lock = locks(spec, arms, records, set(records))
    rows_, noise = gaps(spec, arms, records, lock)
    assert len(rows_) == 3 and all(sorted(g.per_seed) == [1, 2] for g in rows_)
    for g in rows_:
        arm = next(a for a in arms if a.name == g.arm)
        cfg = Config(model=arm.model, optim={"lr": lock[(arm.name, "muon")]}, train={"seed": 1})
        ref = Config(model=arms[0].model, optim={"lr": 0.02}, train={"seed": 1})
        assert g.per_seed[1] == pytest.approx(study_fakes.expected_loss(cfg) - study_fakes.expected_loss(ref))
    assert noise[0].mean == pytest.approx(0.0015)
    text = console.export_text()
    assert "noise floor" in text and "LR sweep" in text and "Gap to the reference" in text

    # status and table read the study dir alone.
    from sanlab.cli import main

    capsys.readouterr()
    assert main(["study", "status", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"] == {"completed": len(records)}
    assert main(["study", "table", str(tmp_path), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [g["arm"] for g in table["gaps"]] == ["iso_param", "iso_flop", "iso_depth"]
    assert table["noise_floor"][0]["mean"] == pytest.approx(0.0015)

    # A rerun trains nothing again.
    before = calls(tmp_path)
    assert len(before) == len(set(before)) == len(records)
    console2 = Console(record=True, width=200)
    assert Study(spec, tmp_path, console=console2, train_fn="study_fakes:train").run() == 0
    assert calls(tmp_path) == before
    assert "already finished, skipped" in console2.export_text()


def test_failing_and_diverging_runs_are_recorded_and_the_study_goes_on(data_dir: Path, tmp_path: Path) -> None:
    spec = make_spec(
        data_dir,
        matching={"arms": ["iso_depth"]},
        arms=[{"name": "broken", "model": {"n_layers": 13}}],
        sweep={"multipliers": [1.0, 32.0], "extend": False},
        noise={"enabled": False},
        seeds=[1],
    )
    assert Study(spec, tmp_path, console=Console(width=200), train_fn="study_fakes:train").run() == 1
    records = ResultStore(tmp_path).runs()
    statuses = {(r["arm"], r["multiplier"]): r["status"] for r in records.values() if "sweep" in r["phases"]}
    assert statuses[("san", 32.0)] == "diverged" and statuses[("san", 1.0)] == "completed"
    broken = [r for r in records.values() if r["arm"] == "broken"]
    assert broken and all(r["status"] == "failed" and "boom" in r["error"] for r in broken)
    finals = [r for r in records.values() if "final" in r["phases"]]
    assert {r["arm"] for r in finals} == {"san", "iso_depth"}
    assert all(r["status"] == "completed" for r in finals)
    rows = {r.arm: r for r in sweep_rows(spec, build_arms(spec), records)}
    assert rows["iso_depth"].at_edge  # 4× optimum, grid stops at 1× (32× diverges)
    # The store keeps each run's resolved config.
    one = next(iter(records.values()))
    assert Config.model_validate(one["config"]).model.vocab_size == 512
    assert json.loads((tmp_path / "study.json").read_text())["name"] == "fake"
