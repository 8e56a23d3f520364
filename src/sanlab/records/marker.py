"""`record.json`: what makes a directory a record, its kind, and which of its files are its own.

    {"format": "sanlab-record", "version": 1, "kind": "matched",
     "files": ["report/report.html", "study/results.jsonl", "study/study.json", …],
     "sha256": {"report/report.html": "…", …}}

`sanlab record export` writes it last, into a dir it staged (see `sanlab.records.export`).
`files` lists every file the export wrote, relative to the record dir, and `sha256` the
content hash of each as written. A re-export replaces a listed file only when its content
still has that hash: the list alone proves nothing (a hand edit or a merge may add the
user's README.md to it), and a file whose content changed since is no longer only the
export's. It refuses to run over anything else under the record's own folders (a file a
user put there). The hand-written files beside them (README.md, record.toml, a spec) are
the user's and never touched. A marker without `sha256` (written before the hashes were)
reads as a record; its files cannot be proven the export's, so a re-export over them is
refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Collection

from sanlab.fileio import read_json
from sanlab.records.common import MARKER, RecordError

FORMAT = "sanlab-record"
VERSION = 1
_HEX = re.compile(r"[0-9a-f]{64}")


def read(record_dir: Path, kinds: Collection[str]) -> dict[str, Any]:
    """The marker of a record dir; `RecordError` (one line naming the key) when absent or
    malformed, or when its kind is none of `kinds` (the registry, `sanlab.records.kinds.KINDS`,
    which imports this module)."""
    path = record_dir / MARKER
    if not path.is_file():
        raise RecordError(f"{record_dir}: not a record (no {MARKER}); `sanlab record export` makes one")
    m = read_json(path, RecordError)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise RecordError(f"{path}: not a record marker (no \"format\": \"{FORMAT}\")")
    if m.get("version") != VERSION:
        raise RecordError(f"{path}: record format version {m.get('version')!r}; this sanlab reads {VERSION}")
    if not isinstance(m.get("kind"), str) or m["kind"] not in kinds:
        raise RecordError(f"{path}: unknown record kind {m.get('kind')!r} (known: {', '.join(kinds)})")
    files = m.get("files")
    if not isinstance(files, list):
        raise RecordError(f"{path}: \"files\" must list the record's own files, as relative paths inside it")
    for i, f in enumerate(files):
        if not (isinstance(f, str) and _inside(f)):
            raise RecordError(f"{path}: \"files\"[{i}] ({f!r}) is not a relative path of a file inside the record")
    if len(set(files)) != len(files):
        raise RecordError(f"{path}: \"files\" lists {next(f for f in files if files.count(f) > 1)!r} twice")
    hashes = m.get("sha256")
    if hashes is not None:
        if not isinstance(hashes, dict):
            raise RecordError(f"{path}: \"sha256\" must map each listed file to its content hash")
        for f, h in hashes.items():
            if f not in files:
                raise RecordError(f"{path}: \"sha256\" holds {f!r}, which \"files\" does not list")
            if not (isinstance(h, str) and _HEX.fullmatch(h)):
                raise RecordError(f"{path}: \"sha256\"[{f!r}] is not a SHA-256 hex digest")
    return m


def _inside(rel: str) -> bool:
    """A file's path relative to the record dir, inside it and not the marker: `.`, `a/..`,
    an absolute path or one with empty or `..` parts name no file of the record's own."""
    if not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts) and parts[0] != MARKER


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def text(kind: str, files: list[str], hashes: dict[str, str] | None = None) -> str:
    data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "kind": kind, "files": sorted(files)}
    if hashes is not None:
        data["sha256"] = {f: hashes[f] for f in sorted(files)}
    return json.dumps(data, indent=1) + "\n"


def is_record(path: Path) -> bool:
    return (path / MARKER).is_file()
