"""The JSONL results store survives a torn last line and keeps the latest outcome per run."""

from __future__ import annotations

from pathlib import Path

from sanlab.study.store import ResultStore


def test_latest_record_wins_and_locks_are_separate(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.append({"type": "run", "run_id": "a", "status": "interrupted"})
    store.append({"type": "run", "run_id": "b", "status": "completed", "final": {"val_loss": 2.0}})
    store.append({"type": "run", "run_id": "a", "status": "completed", "final": {"val_loss": 3.0}})
    store.append({"type": "lock", "arm": "san", "optimizer": "muon", "lr": 0.02})
    runs = store.runs()
    assert runs["a"]["status"] == "completed" and runs["a"]["final"]["val_loss"] == 3.0
    assert set(runs) == {"a", "b"} and all("time" in r for r in runs.values())
    assert store.locks()[("san", "muon")]["lr"] == 0.02


def test_a_torn_last_line_is_skipped_and_appends_continue(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.append({"type": "run", "run_id": "a", "status": "completed"})
    with open(store.path, "a") as f:
        f.write('{"type": "run", "run_id": "b", "sta')  # the study was killed mid-write
    assert set(store.runs()) == {"a"}
    with open(store.path, "a") as f:
        f.write("\n")
    store.append({"type": "run", "run_id": "c", "status": "failed"})
    assert set(store.runs()) == {"a", "c"}


def test_missing_store_reads_empty(tmp_path: Path) -> None:
    assert ResultStore(tmp_path / "nowhere").records() == []
