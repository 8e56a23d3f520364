"""The study's results store: one append-only JSONL file, `results.jsonl`, in the study dir.

Why JSONL and not SQLite or parquet: the store has exactly one writer (the study
process), is read whole by `status` / `table` / analysis, and must survive the study
process being killed at any instant. An append of one complete line per event
(`O_APPEND`, a single `write`, then `fsync`) never rewrites earlier results, so a
kill can at worst leave a torn *last* line, which readers skip. Before the next append
the torn tail is moved to `results.jsonl.torn` (kept, never parsed), so the new record
starts on a line of its own instead of being glued to the torn one and lost with it.
It is greppable, diffable and readable from any language without a driver.

A *damaged* line anywhere (bytes that are not UTF-8, text that is not a JSON object, or a
`run` / `lock` record whose fields do not have the types the writer gives them: a disk
error, a hand edit) is treated the same way. Every reader goes through `lines()`,
which decodes line by line, so such a line is skipped (and `damaged()` names it) instead
of failing the whole file; the writer's `repair()` moves it to `results.jsonl.torn` too,
rewriting the store without it atomically (a temp file, fsync, rename).

Records (one JSON object per line, `type` says which):
- `run`: one run's outcome — `run_id`, `phases`, `arm`, `kind`, `optimizer`,
  `multiplier`, `lr`, `seed`, `tokens`, `status` (completed | diverged | interrupted |
  failed), `final` metrics (incl. `val_loss`), `params`, `flops_per_token`, the
  resolved `config`, `run_dir`, `error`, `wall_s`, `time`.
- `lock`: the LR locked for one arm × optimizer — `arm`, `optimizer`, `multiplier`,
  `lr`, `at_edge`, `losses` (multiplier -> val loss), `time`; `data`, the data point's
  slug, on a data axis (run records carry `data` and `data_value` too).
- `data`: one prepared corpus the study trains on — `data` (its slug, "" without a data
  axis), `key`, `value`, `dir` (relative to the study dir when inside it), `corpus`,
  `train_tokens`, `floor` ({train, val} entropy floor, nats/token) and `world` (the
  planted world's facts, bits and bits per fact; null for other corpora), `time`.
The latest record for a key wins, so a rerun that finishes an interrupted run simply
appends its new outcome.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from sanlab.fileio import parse_line, read_jsonl, try_read_json_object

STORE_NAME = "results.jsonl"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


# record type -> (required fields, field -> the check of its value), as the writer gives them
_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "run": (("run_id", "status"), {
        "run_id": _str, "status": _str, "arm": _str, "kind": _str, "optimizer": _str, "run_dir": _opt(_str),
        "error": _opt(_str), "phases": lambda v: isinstance(v, list) and all(map(_str, v)),
        "multiplier": _opt(_num), "lr": _opt(_num), "seed": _opt(_int), "tokens": _opt(_int),
        "params": _opt(_int), "params_non_embedding": _opt(_int), "flops_per_token": _opt(_num),
        "wall_s": _opt(_num), "config": _opt(lambda v: isinstance(v, dict)),
        "final": _opt(lambda v: isinstance(v, dict) and all(_opt(_num)(x) for x in v.values())),
    }),
    "lock": (("arm", "optimizer", "lr"), {
        "arm": _str, "optimizer": _str, "lr": _num, "multiplier": _opt(_num), "at_edge": _opt(lambda v: v in (True, False)),
        "losses": _opt(lambda v: isinstance(v, dict) and all(_opt(_num)(x) for x in v.values())),
    }),
}


def read_record(raw: bytes) -> dict[str, Any] | None:
    """One store line as its record, or None when it is damaged: not UTF-8 JSON, not an
    object, or a run / lock record missing a field or holding one of another type."""
    rec = parse_line(raw)
    if rec is None or rec.get("type") not in _FIELDS:
        return rec
    required, checks = _FIELDS[rec["type"]]
    if not all(k in rec for k in required) or not all(check(rec[k]) for k, check in checks.items() if k in rec):
        return None
    return rec




def live_status(run_dir: Path) -> str:
    """A run the store does not hold: `running`, `interrupted`, `completed` … as its own
    meta.json says, else `pending`. `study status` and `report` count such runs alike."""
    meta = try_read_json_object(run_dir / "meta.json")
    return "pending" if meta is None else str(meta.get("status", "pending"))


class ResultStore:
    """Append-only JSONL results of one study dir."""

    def __init__(self, study_dir: str | Path) -> None:
        self.path = Path(study_dir) / STORE_NAME

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")

    def _keep_aside(self, lines: list[bytes]) -> None:
        with open(self.torn_path, "ab") as torn:
            torn.write(b"".join(line + b"\n" for line in lines))
            torn.flush()
            os.fsync(torn.fileno())

    def repair(self) -> str | None:
        """End the file with a complete line and hold only readable records: a torn tail
        (a kill mid-append) and any damaged line are moved to `results.jsonl.torn`; a
        complete last record merely missing its newline gets one. Returns what was done,
        or None when nothing needed doing."""
        if not self.path.is_file():
            return None
        notes = []
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                tail = data[cut:]
                if read_record(tail) is not None:
                    f.write(b"\n")
                    data += b"\n"
                else:
                    self._keep_aside([tail])
                    f.truncate(cut)
                    data = data[:cut]
                    notes.append(f"removed a torn last line ({len(tail)} bytes, an append cut short by a kill)")
                f.flush()
                os.fsync(f.fileno())
        lines = data.split(b"\n")[:-1] if data else []
        bad = [i for i, line in enumerate(lines) if line.strip() and read_record(line) is None]
        if bad:
            self._keep_aside([lines[i] for i in bad])
            drop = set(bad)
            keep = b"".join(line + b"\n" for i, line in enumerate(lines) if i not in drop)
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(keep)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            notes.append(f"removed {len(bad)} damaged line(s) ({', '.join(str(i + 1) for i in bad[:10])}: not UTF-8 "
                         "JSON records of the store's fields)")
        if not notes:
            return None
        return f"{self.path}: {'; '.join(notes)}; kept in {self.torn_path.name}"

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

    def lines(self) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
        """(1-based line number, its bytes, its record or None when damaged) of every
        non-blank line, in order: the one reader of the file."""
        for i, raw, rec in read_jsonl(self.path):
            yield i, raw, rec if rec is None else read_record(raw)

    def records(self) -> list[dict[str, Any]]:
        """Every complete record in order; a torn or damaged line is skipped."""
        return [rec for _, _, rec in self.lines() if rec is not None]

    def damaged(self) -> list[int]:
        """Line numbers of the lines `records` skips (torn or damaged)."""
        return [i for i, _, rec in self.lines() if rec is None]

    def runs(self) -> dict[str, dict[str, Any]]:
        """Latest `run` record per run id (records without a string id are skipped)."""
        return {r["run_id"]: r for r in self.records()
                if r.get("type") == "run" and isinstance(r.get("run_id"), str)}

    def locks(self, data: str = "") -> dict[tuple[str, str], dict[str, Any]]:
        """Latest `lock` record per (arm, optimizer) at the data point `data` (its slug; ""
        without a data axis); incomplete records are skipped."""
        return {(r["arm"], r["optimizer"]): r for r in self.records()
                if r.get("type") == "lock" and isinstance(r.get("arm"), str)
                and isinstance(r.get("optimizer"), str) and "lr" in r and (r.get("data") or "") == data}

    def data(self) -> dict[str, dict[str, Any]]:
        """Latest `data` record per data slug."""
        return {(r.get("data") or ""): r for r in self.records()
                if r.get("type") == "data" and isinstance(r.get("data", ""), str)}
