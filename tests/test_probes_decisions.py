"""The probe's decisions and arithmetic on scripted outcomes (no training): the sweep
selects the LR on the validation split, capacity counts log2 of the label alphabet, and
a cell whose every run failed says so (with the error) and never shows an LR edge."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from probe_helpers import completed, use_scripted_runner

from sanlab.cli import main

SMALL = ["task.n_train=40", "task.n_val=8", "task.n_test=12", "row_tokens=64"]


def _lr(job: Any) -> float:
    return float(job.config["optim"]["lr"])


def test_the_sweep_selects_the_lr_on_validation_not_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Two points where the splits disagree: validation prefers ×1, test would prefer ×2.
    by_lr = {0.02: completed(val=0.90, test=0.40), 0.04: completed(val=0.60, test=0.95)}
    use_scripted_runner(monkeypatch, lambda job: by_lr[_lr(job)])
    out = tmp_path / "out"
    assert main(["probe", "retrieval", "--arms", "standard", *SMALL, "sweep.grid=[1,2]", "sweep.max_extensions=0",
                 "--out", str(out)]) == 0
    cell = json.loads((out / "probe-retrieval.json").read_text())["cells"][0]
    assert sorted(p["multiplier"] for p in cell["points"]) == [1.0, 2.0]
    assert cell["multiplier"] == 1.0 and cell["lr"] == 0.02
    assert cell["val_accuracy"] == 0.90 and cell["test_accuracy"] == 0.40  # test at the val-selected LR
    assert cell["at_edge"] is True  # ×1 is the low edge of [1, 2], and no extension was allowed
    row = next(csv.DictReader((out / "probe-retrieval.csv").open()))
    assert float(row["value"]) == pytest.approx(40.0) and float(row["multiplier"]) == 1.0
    grid = capsys.readouterr().out.split("probe suite:")[1]
    assert "40.0*" in grid and "95.0" not in grid


def test_validation_loss_breaks_a_tie_in_validation_accuracy(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    by_lr = {0.01: completed(val=1.0, test=0.7, val_loss=0.30), 0.02: completed(val=1.0, test=0.8, val_loss=0.10),
             0.04: completed(val=1.0, test=0.9, val_loss=0.20)}
    use_scripted_runner(monkeypatch, lambda job: by_lr[_lr(job)])
    out = tmp_path / "out"
    assert main(["probe", "retrieval", "--arms", "standard", *SMALL, "--out", str(out)]) == 0
    cell = json.loads((out / "probe-retrieval.json").read_text())["cells"][0]
    assert cell["multiplier"] == 1.0 and cell["test_accuracy"] == 0.8 and cell["at_edge"] is False
    assert len(cell["points"]) == 3  # an interior best: no extension


def test_capacity_is_memorised_labels_times_log2_of_the_label_alphabet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """alphabet 4 (2 bits a label) against 16 key symbols (4 bits): only the label alphabet
    is the information in a memorised label."""
    params = {"muon": 300, "adamw": 200, "frozen": 1000}  # trainable: 500 (frozen ones do not count)
    memorised = {16: 16, 64: 40}

    def outcome(job: Any) -> dict[str, Any]:
        run = Path(job.run_dir)
        run.mkdir(parents=True, exist_ok=True)
        (run / "meta.json").write_text(json.dumps({"status": "completed", "routing": params}))
        n = int(job.run_id.split("-n")[1].split("-")[0])
        return completed(val=memorised[n] / n, test=memorised[n] / n, correct=memorised[n], total=n)

    use_scripted_runner(monkeypatch, outcome)
    out = tmp_path / "out"
    assert main(["probe", "capacity", "--arms", "standard", "task.alphabet=4", "task.key_symbols=16",
                 "capacity.ns=[16,64]", "sweep.grid=[1]", "sweep.max_extensions=0", "row_tokens=64",
                 "--out", str(out)]) == 0
    res = json.loads((out / "probe-capacity.json").read_text())
    cap = res["capacity"]["standard"]
    assert cap["alphabet"] == 4 and cap["params"] == 500
    assert cap["n"] == 64 and cap["memorised"] == 40 and cap["bits"] == pytest.approx(40 * math.log2(4))
    assert cap["bits_per_param"] == pytest.approx(80 / 500)  # log2(16) would give 160 / 500
    assert res["table"]["standard"]["capacity"] == pytest.approx(0.16)
    assert cap["lower_bound"] is False and cap["chance"] == pytest.approx(64 / 4)
    text = capsys.readouterr().out
    assert "0.160 bits/param = 40 labels × log2(4) / 500 trainable params" in text


def test_a_cell_whose_every_run_failed_says_failed_with_the_error_and_no_edge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    error = "DataError: data.dir=runs/probe/data/retrieval-1234: no such directory"

    def outcome(job: Any) -> dict[str, Any]:
        if "-standard-" in job.run_id:
            return {"status": "failed", "final": {}, "error": error, "wall_s": 0.0}
        return completed(val=0.5 + _lr(job), test=0.5)  # san: better at every higher LR, so at an edge

    runner = use_scripted_runner(monkeypatch, outcome)
    out = tmp_path / "out"
    assert main(["probe", "retrieval", "--arms", "standard,san", *SMALL, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    # the failing cell ran its grid once: an error is not a reason to try other LRs
    assert sum("-standard-" in c for c in runner.calls) == 3
    assert sum("-san-" in c for c in runner.calls) == 5  # [0.5, 1, 2] + two extensions upward
    res = json.loads((out / "probe-retrieval.json").read_text())
    std, san = res["cells"]
    assert std["lr"] is None and std["at_edge"] is False and std["failed"] is True and std["error"] == error
    assert san["at_edge"] is True and san["multiplier"] == 8.0
    assert res["unscored"] == {"standard": {"retrieval": {"status": "failed", "error": error}}}
    grid = captured.out.split("probe suite:")[1].split("SPEC §2 anchors")[0]
    rows = {name: next(line for line in grid.splitlines() if f" {name} " in line) for name in ("Standard", "SAN")}
    assert "failed" in rows["Standard"] and "*" not in rows["Standard"]
    assert "50.0*" in rows["SAN"]
    assert f"Retrieval / Standard: every run failed; the first error: {error}" in captured.out


def test_a_cell_whose_every_run_failed_shows_no_edge_marker_at_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_scripted_runner(monkeypatch, lambda job: {"status": "failed", "final": {}, "error": "RuntimeError: boom"})
    out = tmp_path / "out"
    assert main(["probe", "retrieval", "--arms", "standard", *SMALL, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "*" not in text and "edge" not in text
    assert "every run failed; the first error: RuntimeError: boom" in text
    row = next(csv.DictReader((out / "probe-retrieval.csv").open()))
    assert row["value"] == "" and row["at_edge"] == "False"
