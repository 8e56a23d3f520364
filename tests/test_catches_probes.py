"""Tests that catch planted bugs in the probe suite's sweep cells, scoring and data dirs
(`sanlab.probes.runner`; each one a mutant in scripts/mutate.py, named in its docstring)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


# --------------------------------------------------------------------------- probes/runner.py


def _cell(points: dict[float, Any], **sweep: Any) -> Any:
    from sanlab.probes.runner import Cell, SweepSettings

    return Cell("retrieval/standard", "retrieval", None, None, None,  # type: ignore[arg-type]
                SweepSettings(**sweep), None, dict(points))


def _point(m: float, status: str | None = "completed", acc: float | None = 1.0, loss: float | None = 0.5,
           error: str | None = None) -> Any:
    from sanlab.probes.runner import Point

    return Point(m, 0.02 * m, f"runs/x{m}", status=status, val_accuracy=acc, val_loss=loss, error=error)


def test_a_point_without_a_finite_val_loss_loses_an_accuracy_tie() -> None:
    """probe-nan-loss-best-tiebreak: the tie-break counts a missing / non-finite val loss as
    1e3 (the worst), never as 0."""
    assert _point(1.0, loss=float("nan")).criterion() == pytest.approx(1e-3)
    cell = _cell({0.5: _point(0.5, acc=0.5), 1.0: _point(1.0, loss=float("nan")), 2.0: _point(2.0, loss=0.5)},
                 max_extensions=0)
    assert cell.decision().best == 2.0


def test_a_cells_first_error_is_the_x1_points() -> None:
    """probe-first-error-order: the error reported is the first in the order the sweep ran (×1 first)."""
    cell = _cell({0.5: _point(0.5, "failed", None, None, "A"), 1.0: _point(1.0, "failed", None, None, "B"),
                  2.0: _point(2.0, "failed", None, None, "C")})
    assert cell.first_error() == "B"


def test_one_failed_point_does_not_fail_the_cell_or_stop_its_extension() -> None:
    """probe-failed-any: a cell is failed only when every point run so far failed."""
    cell = _cell({0.5: _point(0.5, "failed", None, None, "boom"), 1.0: _point(1.0, acc=0.5),
                  2.0: _point(2.0, acc=0.9)})
    assert cell.failed() is False
    assert cell.decision().pending == (4.0,)


def test_a_retrained_run_is_scored_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """probe-stale-score: probe.json of an earlier training (another finished_at) is not reused."""
    import sanlab.probes.evaluate as evaluate
    from sanlab.probes.runner import PROBE_FILE, score_run

    (tmp_path / PROBE_FILE).write_text(json.dumps({"finished_at": "old", "val_accuracy": 0.1, "test_accuracy": 0.1}))
    monkeypatch.setattr(evaluate, "run_accuracy",
                        lambda out_dir: {"val": {"accuracy": 0.9}, "test": {"accuracy": 0.8}})
    meta = score_run(None, tmp_path,  # type: ignore[arg-type]
                     {"status": "completed", "finished_at": "new", "final": {}})
    assert meta["final"]["val_accuracy"] == 0.9 and meta["final"]["test_accuracy"] == 0.8
    assert json.loads((tmp_path / PROBE_FILE).read_text())["finished_at"] == "new"


def _cells(tmp_path: Path, items: list[str]) -> list[Any]:
    from sanlab.probes.arms import resolve_arms
    from sanlab.probes.runner import Overrides
    from sanlab.probes.suite import build_cells

    ov = Overrides.parse(items)
    return build_cells(["retrieval"], resolve_arms(["standard"]), ov, ov.options_model(), False, tmp_path)


SMALL = ["task.n_train=40", "task.n_val=8", "task.n_test=24"]


def test_a_probe_run_evaluates_every_val_row(tmp_path: Path) -> None:
    """probe-eval-rows-test: train.eval_rows is the val split's row count."""
    (cell,) = _cells(tmp_path, [*SMALL, "row_tokens=64"])
    assert cell.data.rows["val"] != cell.data.rows["test"]
    assert cell.config.train.eval_rows == cell.data.rows["val"]


def test_two_row_lengths_get_two_data_dirs(tmp_path: Path) -> None:
    """probe-data-hash-no-row-tokens: the data dir's name depends on row_tokens (the packing)."""
    (a,) = _cells(tmp_path, [*SMALL, "row_tokens=64"])
    (b,) = _cells(tmp_path, [*SMALL, "row_tokens=128"])
    assert a.data.seq_len != b.data.seq_len
    assert a.data.out != b.data.out
