"""`record.json`: what makes a directory a record, its kind, and which of its files are its own.

    {"format": "sanlab-record", "version": 1, "kind": "matched",
     "files": ["report/report.html", "study/results.jsonl", "study/study.json", …]}

`sanlab record export` writes it last, into a dir it staged (see `sanlab.records.export`).
`files` lists every file the export wrote, relative to the record dir: a re-export
replaces exactly those and refuses to run over anything else under the record's own
folders (a file a user put there). The hand-written files beside them (README.md,
record.toml, a spec) are the user's and never touched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sanlab.fileio import read_json
from sanlab.records.common import MARKER, RecordError

FORMAT = "sanlab-record"
VERSION = 1


def read(record_dir: Path) -> dict[str, Any]:
    """The marker of a record dir; `RecordError` (one line) when absent or malformed."""
    path = record_dir / MARKER
    if not path.is_file():
        raise RecordError(f"{record_dir}: not a record (no {MARKER}); `sanlab record export` makes one")
    m = read_json(path, RecordError)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise RecordError(f"{path}: not a record marker (no \"format\": \"{FORMAT}\")")
    if m.get("version") != VERSION:
        raise RecordError(f"{path}: record format version {m.get('version')!r}; this sanlab reads {VERSION}")
    # lazy: import cycle (the registry, sanlab.records.kinds, imports every kind's module and this one)
    from sanlab.records.kinds import KINDS

    if m.get("kind") not in KINDS:
        raise RecordError(f"{path}: unknown record kind {m.get('kind')!r} (known: {', '.join(KINDS)})")
    files = m.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) and _inside(f) for f in files):
        raise RecordError(f"{path}: \"files\" must list the record's own files, as relative paths inside it")
    return m


def _inside(rel: str) -> bool:
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and p.parts[0] != MARKER


def text(kind: str, files: list[str]) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "kind": kind, "files": sorted(files)}, indent=1) + "\n"


def is_record(path: Path) -> bool:
    return (path / MARKER).is_file()
