"""`sanlab probe --suite --merge SRC --out DIR`: suites run in pieces joined into one,
recomputed from the cells (the grid is 100 × test accuracy; capacity = max over N of
memorised · log2 A / trainable params), with each piece's run files copied beside."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sanlab.cli import main

ARMS = [{"name": "standard", "label": "Standard", "overrides": ["model.ffn=true"]},
        {"name": "san", "label": "SAN", "overrides": ["model.ffn=false"]}]


def _cell(key: str, arm: str, correct: int, total: int, run_dir: str, params: int = 100,
          **task: Any) -> dict[str, Any]:
    return {"key": key, "task": key.split("/")[0], "arm": arm, "label": arm, "arm_overrides": [],
            "task_config": task, "base_lr": 0.02, "multiplier": 1.0, "lr": 0.02, "at_edge": False,
            "failed": False, "error": None, "val_accuracy": correct / total, "test_accuracy": correct / total,
            "test_correct": correct, "test_total": total, "trainable_params": params, "params": params,
            "points": [{"multiplier": 1.0, "lr": 0.02, "run_dir": run_dir, "status": "completed"}]}


def _piece(d: Path, tasks: list[str], cells: list[dict[str, Any]], *, runs: bool = True, arms: Any = ARMS,
           quick: bool = False, wall_s: float = 10.0) -> Path:
    d.mkdir(parents=True)
    (d / "suite.json").write_text(json.dumps({"quick": quick, "tasks": tasks, "arms": arms, "table": {},
                                              "capacity": {}, "cells": cells, "wall_s": wall_s}))
    for c in cells if runs else []:
        for p in c["points"]:
            (d / p["run_dir"]).mkdir(parents=True)
            (d / p["run_dir"] / "probe.json").write_text(json.dumps({"key": c["key"]}))
    return d


def _pieces(root: Path, *, runs_a: bool = True) -> tuple[Path, Path]:
    a = _piece(root / "a", ["retrieval"], [
        _cell("retrieval/standard", "standard", 256, 256, "runs/r-std"),
        _cell("retrieval/san", "san", 64, 256, "runs/r-san", params=40)], runs=runs_a)
    cap = {"alphabet": 16, "key_symbols": 16, "key_len": 4}
    b = _piece(root / "b", ["capacity"], [
        _cell("capacity-n64/standard", "standard", 60, 64, "runs/c64-std", n_train=64, **cap),
        _cell("capacity-n256/standard", "standard", 100, 256, "runs/c256-std", n_train=256, **cap),
        _cell("capacity-n64/san", "san", 20, 64, "runs/c64-san", params=40, n_train=64, **cap),
        _cell("capacity-n256/san", "san", 30, 256, "runs/c256-san", params=40, n_train=256, **cap)], wall_s=5.0)
    return a, b


def test_a_merge_recomputes_the_grid_from_both_pieces_cells_in_spec_order(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _pieces(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    assert main(["probe", "--suite", "--merge", "a", "--merge", "b", "--out", "merged", "--format", "json"]) == 0
    res = json.loads((tmp_path / "merged" / "suite.json").read_text())
    assert res["tasks"] == ["capacity", "retrieval"]  # SPEC §2's column order, not the pieces'
    assert res["table"]["standard"]["retrieval"] == pytest.approx(100.0)
    assert res["table"]["san"]["retrieval"] == pytest.approx(25.0)  # 64 / 256
    # capacity: max over N of memorised · log2(16) / params: standard max(60, 100)·4/100
    assert res["table"]["standard"]["capacity"] == pytest.approx(100 * 4 / 100)
    assert res["table"]["san"]["capacity"] == pytest.approx(30 * 4 / 40)
    assert res["capacity"]["san"]["points"] == [{"n": 64, "memorised": 20}, {"n": 256, "memorised": 30}]
    assert res["anchors"]["standard"] == {"capacity": 2.98, "retrieval": 100.0}
    assert res["wall_s"] == pytest.approx(15.0)
    assert len(res["cells"]) == 6
    csv_rows = (tmp_path / "merged" / "suite.csv").read_text().splitlines()
    assert any(r.startswith("san,SAN,retrieval,test_accuracy_pct,25,") for r in csv_rows), csv_rows
    for rd in ("r-std", "r-san", "c64-std", "c256-san"):
        assert (tmp_path / "merged" / "runs" / rd / "probe.json").is_file()


def test_merging_into_a_suite_keeps_its_own_cells_and_counts_points_without_run_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _pieces(tmp_path, runs_a=False)
    assert main(["probe", "--suite", "--merge", str(a), "--out", str(b)]) == 0
    res = json.loads((b / "suite.json").read_text())
    assert res["tasks"] == ["capacity", "retrieval"]
    assert res["table"]["san"]["capacity"] == pytest.approx(3.0)  # b's own cells survived the merge
    assert not (b / "runs" / "r-std").exists()
    out = capsys.readouterr()
    assert "2 sweep point(s) without run files" in out.out + out.err


@pytest.mark.parametrize("case, message", [
    ("same-task", "task 'retrieval' is in both"),
    ("other-arms", "its arms (standard) are not"),
    ("other-overrides", "its arm 'standard' has overrides [model.ffn=false], not [model.ffn=true]"),
    ("quick", "is --quick and"),
    ("missing", "no such directory"),
    ("a-file", "not a directory"),
    ("not-a-suite", "no suite.json"),
    ("outside", "run dir '../elsewhere' is not runs/RUN_ID"),
])
def test_a_merge_that_does_not_fit_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str) -> None:
    a, b = _pieces(tmp_path)
    other = {
        "same-task": lambda: _piece(tmp_path / "c", ["retrieval"], [
            _cell("retrieval/standard", "standard", 1, 256, "runs/x")]),
        "other-arms": lambda: _piece(tmp_path / "c", ["dyck"], [], arms=ARMS[:1]),
        # the same names, another suite: two different experiments joined as one
        "other-overrides": lambda: _piece(tmp_path / "c", ["dyck"], [],
                                          arms=[{**ARMS[0], "overrides": ["model.ffn=false"]}, ARMS[1]]),
        "quick": lambda: _piece(tmp_path / "c", ["dyck"], [], quick=True),
        "missing": lambda: tmp_path / "nowhere",
        "a-file": lambda: (tmp_path / "f").write_text("x") and tmp_path / "f",
        "not-a-suite": lambda: (tmp_path / "c").mkdir() or tmp_path / "c",
        "outside": lambda: _piece(tmp_path / "c", ["dyck"], [_cell("dyck/standard", "standard", 1, 8, "../elsewhere")],
                                  runs=False),
    }[case]()
    out = tmp_path / "out"
    assert main(["probe", "--suite", "--merge", str(a), "--merge", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists() or not any(out.iterdir())  # nothing copied, nothing written


def test_merge_trains_nothing_so_it_refuses_training_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _pieces(tmp_path)
    assert main(["probe", "--suite", "--merge", str(a), "--tasks", "dyck", "--out", str(tmp_path / "o")]) == 2
    assert "drop --tasks" in capsys.readouterr().err
    assert main(["probe", "--merge", str(a), "--out", str(tmp_path / "o")]) == 2
    assert "give it with --suite" in capsys.readouterr().err
