"""The study's results store: one append-only JSONL file, `results.jsonl`, in the study dir.

Why JSONL and not SQLite or parquet: the store has exactly one writer (the study
process), is read whole by `status` / `table` / analysis, and must survive the study
process being killed at any instant. An append of one complete line per event
(`O_APPEND`, a single `write`, then `fsync`) never rewrites earlier results, so a
kill can at worst leave a torn *last* line, which readers skip. Before the next append
the torn tail is moved to `results.jsonl.torn` (kept, never parsed), so the new record
starts on a line of its own instead of being glued to the torn one and lost with it.
It is greppable, diffable and readable from any language without a driver.

Records (one JSON object per line, `type` says which):
- `run`: one run's outcome — `run_id`, `phases`, `arm`, `kind`, `optimizer`,
  `multiplier`, `lr`, `seed`, `tokens`, `status` (completed | diverged | interrupted |
  failed), `final` metrics (incl. `val_loss`), `params`, `flops_per_token`, the
  resolved `config`, `run_dir`, `error`, `wall_s`, `time`.
- `lock`: the LR locked for one arm × optimizer — `arm`, `optimizer`, `multiplier`,
  `lr`, `at_edge`, `losses` (multiplier -> val loss), `time`.
The latest record for a key wins, so a rerun that finishes an interrupted run simply
appends its new outcome.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STORE_NAME = "results.jsonl"


class ResultStore:
    """Append-only JSONL results of one study dir."""

    def __init__(self, study_dir: str | Path) -> None:
        self.path = Path(study_dir) / STORE_NAME

    def repair(self) -> str | None:
        """End the file with a complete line: a torn tail (a kill mid-append) is moved to
        `results.jsonl.torn`; a complete last record merely missing its newline gets one.
        Returns what was done, or None when nothing needed doing."""
        if not self.path.is_file():
            return None
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return None
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            try:
                complete = isinstance(json.loads(tail), dict)
            except (json.JSONDecodeError, UnicodeDecodeError):
                complete = False
            if complete:
                f.write(b"\n")
                note = None
            else:
                with open(self.path.with_name(self.path.name + ".torn"), "ab") as torn:
                    torn.write(tail + b"\n")
                    torn.flush()
                    os.fsync(torn.fileno())
                f.truncate(cut)
                note = (f"{self.path}: removed a torn last line ({len(tail)} bytes, an append cut short "
                        f"by a kill; kept in {self.path.name}.torn)")
            f.flush()
            os.fsync(f.fileno())
        return note

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as one line, durably, in a single write."""
        line = (json.dumps({**record, "time": time.time()}, sort_keys=True) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repair()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        """Every complete record in order; a torn last line (killed mid-write) is skipped."""
        if not self.path.is_file():
            return []
        out: list[dict[str, Any]] = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def runs(self) -> dict[str, dict[str, Any]]:
        """Latest `run` record per run id (records without a string id are skipped)."""
        return {r["run_id"]: r for r in self.records()
                if r.get("type") == "run" and isinstance(r.get("run_id"), str)}

    def locks(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Latest `lock` record per (arm, optimizer) (incomplete records are skipped)."""
        return {(r["arm"], r["optimizer"]): r for r in self.records()
                if r.get("type") == "lock" and isinstance(r.get("arm"), str)
                and isinstance(r.get("optimizer"), str) and "lr" in r}
