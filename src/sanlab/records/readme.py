"""A record's README: hand-written prose around generated blocks, each between
`<!-- records:BEGIN NAME -->` and `<!-- records:END NAME -->`. The record's kind decides
which blocks there are (`sanlab.records.kinds`); `readme` rewrites them from the
committed results, `check` compares them with what those results give."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from sanlab.records import marker
from sanlab.records.common import MARKER, README, RecordError, write_text
from sanlab.records.kinds import KINDS, Loaded, load

BLOCK = re.compile(r"<!-- records:BEGIN (\S+) -->\n(.*?)<!-- records:END \1 -->", re.S)
BEGIN = re.compile(r"<!-- records:BEGIN (\S+) -->")
END = re.compile(r"<!-- records:END (\S+) -->")


def _check_markers(text: str, path: Path) -> list[str]:
    """The names of the README's blocks, each a BEGIN line and its END once; `RecordError`
    naming the first marker without its partner (a block that is not one is never
    skipped: its stale text would pass `check`)."""
    seen = [m.group(1) for m in BLOCK.finditer(text)]
    for name in dict.fromkeys(BEGIN.findall(text)):
        if name not in seen:
            raise RecordError(f"{path}: `<!-- records:BEGIN {name} -->` has no `<!-- records:END {name} -->` "
                              "after it on a line of its own; restore the marker")
    for name in END.findall(text):
        if name not in seen:
            raise RecordError(f"{path}: `<!-- records:END {name} -->` has no BEGIN before it; restore the marker")
    twice = next((n for n in seen if seen.count(n) > 1), None)
    if twice is not None:
        raise RecordError(f"{path}: block {twice!r} is there twice; keep one")
    if len(BEGIN.findall(text)) != len(seen) or len(END.findall(text)) != len(seen):
        raise RecordError(f"{path}: a records marker is inside another block; restore the markers")
    return seen


def skeleton(rec: Loaded) -> str:
    """A new README: a title, where the numbers come from, and every block's markers."""
    name = rec.dir.name
    parts = [f"# Record {name} ({rec.kind.what})\n",
             "The tables between the `records:` markers are generated from the committed results by "
             f"`sanlab record readme records/{name}`; `make records-check` checks them.\n"]
    for b in rec.kind.blocks:
        parts.append(f"## {b}\n\n<!-- records:BEGIN {b} -->\n<!-- records:END {b} -->\n")
    return "\n".join(parts)


def render(text: str, rec: Loaded) -> tuple[str, list[str]]:
    """(the README with every block replaced, names of the blocks whose text changed)."""
    blocks = rec.kind.blocks
    seen = _check_markers(text, rec.dir / README)
    unknown = [n for n in seen if n not in blocks]
    if unknown:
        raise RecordError(f"README block {unknown[0]!r} is not one of a {rec.kind.name} record's: "
                          f"{', '.join(blocks)}")
    if not seen:
        raise RecordError(f"{rec.dir / README}: no `<!-- records:BEGIN NAME -->` blocks")
    changed: list[str] = []

    def sub(m: re.Match[str]) -> str:
        new = blocks[m.group(1)](rec.data).rstrip("\n") + "\n"
        if m.group(2) != new:
            changed.append(m.group(1))
        return f"<!-- records:BEGIN {m.group(1)} -->\n{new}<!-- records:END {m.group(1)} -->"

    return BLOCK.sub(sub, text), changed


def _read_readme(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: not readable ({e})") from None


def readme(record_dir: str | Path, *, check: bool = False, log: Callable[[str], Any] = print) -> int:
    """Rewrite the README's blocks from the committed results (0), or with `check` write
    nothing and return 1 naming each block whose text differs (0 when all equal)."""
    rec = load(record_dir)
    path = rec.dir / README
    if not path.is_file():
        if check:
            raise RecordError(f"{path}: no README")
        text = skeleton(rec)
    else:
        text = _read_readme(path)
    new, changed = render(text, rec)
    if check:
        for name in changed:
            log(f"{path}: block {name!r} differs from what the committed results give")
        if changed:
            log(f"regenerate with: sanlab record readme {record_dir}")
        return 1 if changed else 0
    if new != text:
        write_text(path, new)
    log(f"{path}: {len(changed)} block(s) updated" + (f" ({', '.join(changed)})" if changed else ""))
    return 0


def find_records(paths: list[Path]) -> list[Path]:
    """Each path as a record dir, or the record dirs directly inside it (a `records/`
    folder); `RecordError` when a path is neither."""
    out: list[Path] = []
    for p in paths:
        if marker.is_record(p):
            out.append(p)
            continue
        if not p.is_dir():
            raise RecordError(f"{p}: no such record dir")
        found = sorted(c for c in p.iterdir() if c.is_dir() and marker.is_record(c))
        if not found:
            raise RecordError(f"{p}: not a record (no {MARKER}) and holds no records")
        out += found
    return out


def missing_files(record_dir: Path) -> list[str]:
    """The files `record.json` lists that the record dir does not hold (sorted)."""
    return sorted(f for f in marker.read(record_dir, KINDS)["files"] if not (record_dir / f).is_file())


def check(paths: list[Path], *, log: Callable[[str], Any] = print) -> int:
    """On every record found in `paths`: every file its `record.json` lists is there, and
    `readme --check` (every README block equals what its committed results give).
    1 when a file is missing or a block differs, else 0."""
    records = find_records(paths)
    bad = []
    for r in records:
        missing = missing_files(r)
        if missing:
            log(f"{r}: {len(missing)} of the files {MARKER} lists are missing (first: {missing[0]}); "
                "a record is committed whole (is the path ignored by git?)")
        if readme(r, check=True, log=log) or missing:
            bad.append(r)
    if not bad:
        log(f"records: {len(records)} record(s) whole, their README(s) equal their results")
    return 1 if bad else 0
