"""The probe suite's table (`sanlab.probes.suite.results`) from cells whose numbers are
given: each task cell is 100 × the *test* accuracy at the locked LR (the validation
accuracy only chose the LR), and capacity counts the test split's correct labels."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sanlab.probes.arms import Arm
from sanlab.probes.suite import CAPACITY, results


class _Cell:
    """What `results` reads of a cell: its summary and its best point (no run dir here)."""

    def __init__(self, run_dir: Path | None = None, **summary: Any) -> None:
        self._summary = summary
        self._run_dir = run_dir

    def summary(self) -> dict[str, Any]:
        return dict(self._summary)

    def best(self) -> SimpleNamespace | None:
        return SimpleNamespace(run_dir=str(self._run_dir)) if self._run_dir else None


def _summary(key: str, arm: str, val: float, test: float, correct: int, total: int, **task: Any) -> dict[str, Any]:
    return {"key": key, "task": key.split("/")[0], "arm": arm, "label": arm, "task_config": task,
            "multiplier": 1.0, "lr": 0.02, "at_edge": False, "val_accuracy": val, "test_accuracy": test,
            "test_correct": correct, "test_total": total, "points": []}


def test_the_table_shows_the_test_accuracy_where_val_and_test_disagree() -> None:
    arm = Arm("standard", ())
    cells = [_Cell(**_summary("retrieval/standard", "standard", val=0.90, test=0.25, correct=5, total=20))]
    res = results(["retrieval"], [arm], cells, quick=True, out=Path("."))
    assert res["table"]["standard"]["retrieval"] == pytest.approx(25.0)  # 100 × test, not 90


def test_capacity_counts_the_test_splits_correct_labels(tmp_path: Path) -> None:
    """memorize's test split is its training set: memorised(N) = test_correct, and
    capacity = max over N of memorised · log2(alphabet) / trainable params (frozen ones out)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"routing": {"matrix": 100, "embedding": 50, "frozen": 1000}}))
    arm = Arm("standard", ())
    task = {"alphabet": 8, "key_symbols": 16, "key_len": 4}
    cells = [_Cell(run, **_summary("capacity-n64/standard", "standard", val=0.5, test=0.75, correct=48, total=64,
                                   n_train=64, **task)),
             _Cell(run, **_summary("capacity-n256/standard", "standard", val=0.9, test=0.25, correct=64,
                                   total=256, n_train=256, **task))]
    res = results([CAPACITY], [arm], cells, quick=True, out=tmp_path)
    cap = res["capacity"]["standard"]
    assert cap["points"] == [{"n": 64, "memorised": 48}, {"n": 256, "memorised": 64}]
    assert cap["params"] == 150 and cap["n"] == 256
    assert res["table"]["standard"][CAPACITY] == pytest.approx(64 * math.log2(8) / 150)  # 1.28


def test_suite_csv_fano_row_holds_the_chance_free_reading(tmp_path: Path) -> None:
    """suite.csv's `bits_per_param_fano` row is Fano's bound at its own best N
    (docs/commands/probe.md), not the count reading's: here the count picks N=256
    (64 labels · 3 bits), Fano N=64 (48 of 64 right is far above chance; 64 of 256 is
    chance, 1/8 · 256 = 32, barely beaten)."""
    import csv
    import io

    from sanlab.probes.capacity import fano_bits
    from sanlab.probes.suite import csv_text

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"routing": {"matrix": 100, "embedding": 50, "frozen": 1000}}))
    task = {"alphabet": 8, "key_symbols": 16, "key_len": 4}
    cells = [_Cell(run, **_summary("capacity-n64/standard", "standard", val=0.75, test=0.75, correct=48, total=64,
                                   n_train=64, **task)),
             _Cell(run, **_summary("capacity-n256/standard", "standard", val=0.25, test=0.25, correct=64,
                                   total=256, n_train=256, **task))]
    res = results([CAPACITY], [Arm("standard", ())], cells, quick=True, out=tmp_path)
    rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(csv_text(res)))}
    count, fano = rows["bits_per_param"], rows["bits_per_param_fano"]
    assert float(count["value"]) == pytest.approx(64 * 3 / 150, rel=1e-5)
    assert (count["correct"], count["total"], count["trainable_params"]) == ("64", "256", "150")
    # 64 · (3 − H₂(0.75) − 0.25 · log2 7) bits over 150 parameters
    h2 = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    assert float(fano["value"]) == pytest.approx(64 * (3 - h2 - 0.25 * math.log2(7)) / 150, rel=1e-5)
    assert float(fano["value"]) == pytest.approx(fano_bits(48, 64, 8) / 150, rel=1e-5)
    assert (fano["correct"], fano["total"], fano["trainable_params"]) == ("48", "64", "150")
