"""`sanlab record export SOURCE RECORD_DIR`: copy what a record's tables and report are
computed from (no checkpoints, no data shards), with paths made relative.

Where it may write, checked before anything is written (a one-line `RecordError`, exit 2,
nothing touched otherwise):

- a missing or empty RECORD_DIR, or one that is already a record (`record.json`) of the
  same kind, whose own folders hold nothing but its own files (those `record.json` lists),
  each with the content hash its export wrote in `record.json` (a listed file that was
  edited, or listed by a hand edit of the marker, is refused: never replaced);
- never a dir with other files in it, the source itself (or a dir inside it, or one it is
  inside), a training run dir, a study dir, a path under a file, or a dir it may not write.

The copy is built in a temp dir beside RECORD_DIR, checked (the study's tables on the
copy must equal the original's), and only then moved into place: the whole dir when
RECORD_DIR is new or empty, else each of the record's own entries (`study/`, `report/`,
`record.json`) swapped in turn, the old ones removed only after every swap. A failure at
any point removes the temp dir and leaves RECORD_DIR as it was. The hand-written files of
a record (README.md, record.toml, a spec) are never touched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from sanlab.paths import check_out_dir, check_path, is_run_dir
from sanlab.records import marker
from sanlab.records.common import MARKER, RecordError
from sanlab.records.kinds import KINDS, kind_of_source

Log = Callable[[str], Any]


# --------------------------------------------------------------------------- where it may write


def _files_under(path: Path) -> list[Path]:
    if path.is_file() or path.is_symlink():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())


def check_destination(src: Path, dst: Path, kind: str, entries: list[str]) -> dict[str, Any] | None:
    """Refuse any RECORD_DIR export may not write into (module docstring); nothing is
    written. Returns the old marker when RECORD_DIR is already a record."""
    check_path(dst, "RECORD_DIR")  # a bad name, a symlink loop: before anything resolves it
    s, d = src.resolve(), dst.resolve()
    if d == s:
        raise RecordError(f"RECORD_DIR {dst}: is the source itself; export into a record dir of its own")
    if d.is_relative_to(s):
        raise RecordError(f"RECORD_DIR {dst}: is inside the source {src}; export it somewhere else")
    if s.is_relative_to(d):
        raise RecordError(f"RECORD_DIR {dst}: holds the source {src}; export into a dir outside it")
    check_out_dir(dst, "RECORD_DIR", whole=True)  # a file, a path under a file, no permission, the cwd
    if not dst.exists() or not any(dst.iterdir()):
        return None
    if marker.is_record(dst):
        old = marker.read(dst, KINDS)
        if old["kind"] != kind:
            raise RecordError(f"RECORD_DIR {dst}: is a {old['kind']} record; this source makes a {kind} record")
        own = set(old["files"])
        hashes = old.get("sha256") or {}
        for f in sorted(own):  # only what this record's export wrote, unchanged since, may be replaced
            p = dst / f
            if not (p.exists() or p.is_symlink()):
                continue
            if not p.is_file() or p.is_symlink() or hashes.get(f) != marker.file_hash(p):
                why = ("is not a plain file" if not p.is_file() or p.is_symlink() else
                       f"has no content hash in {MARKER}" if f not in hashes else
                       "differs from what the record's export wrote")
                raise RecordError(f"RECORD_DIR {dst}: {f} {why}, so it is not provably the export's own; "
                                  "move it out (or restore it) first, nothing was exported")
        tops = set(entries) | {Path(f).parts[0] for f in own}
        for top in sorted(tops):
            for f in _files_under(dst / top) if (dst / top).exists() else []:
                if f.relative_to(dst).as_posix() not in own:
                    raise RecordError(f"RECORD_DIR {dst}: {f.relative_to(dst)} is not one of the record's own "
                                      f"files ({MARKER} does not list it); move it out first, nothing was exported")
        return old
    if is_run_dir(dst):
        raise RecordError(f"RECORD_DIR {dst}: is a training run dir (it holds config.json / meta.json), not a record")
    if (dst / "study.json").is_file():
        raise RecordError(f"RECORD_DIR {dst}: is a study dir (it holds study.json), not a record")
    raise RecordError(f"RECORD_DIR {dst}: is not empty and not a record (no {MARKER}); "
                      "export into a new or empty dir, or into an existing record")


# --------------------------------------------------------------------------- the export


def _install(staged: Path, dst: Path, entries: list[str], old: dict[str, Any] | None) -> None:
    """Move the staged record into place (see the module docstring)."""
    if not dst.exists() or not any(dst.iterdir()):
        os.replace(staged, dst)  # a missing or empty dst: one rename
        return
    gone = staged / ".replaced"
    gone.mkdir()
    tops = list(dict.fromkeys([*entries, *(Path(f).parts[0] for f in (old or {}).get("files", []))]))
    moved: list[tuple[Path, Path | None]] = []  # (dst entry, where the old one went)
    try:
        for top in tops:
            target = dst / top
            aside = None
            if target.exists():
                aside = gone / top
                os.replace(target, aside)
            moved.append((target, aside))
            if (staged / top).exists():
                os.replace(staged / top, target)
        os.replace(staged / MARKER, dst / MARKER)
    except BaseException:
        for target, aside in reversed(moved):  # put the old record back as it was
            if target.exists():
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            if aside is not None:
                os.replace(aside, target)
        raise


def export(source: str | Path, record_dir: str | Path, *, verify: bool = True, log: Log = print) -> list[str]:
    """Export a finished study dir or probe suite into a record dir (module docstring);
    the record's own files, relative to it."""
    src, dst = Path(source), Path(record_dir)
    kind = kind_of_source(src)
    entries = kind.entries(src)
    old = check_destination(src, dst, kind.name, entries)
    made = []  # parents created here, removed again on a failure
    p = dst.parent
    while not p.exists():
        made.append(p)
        p = p.parent
    for p in reversed(made):
        p.mkdir()
    staged = dst.parent / f".{dst.name}.export-{os.getpid()}"
    try:
        if staged.exists():
            shutil.rmtree(staged)
        staged.mkdir()
        files = kind.copy(src, staged, log)
        if verify and kind.verify is not None:
            kind.verify(src, staged)
        (staged / MARKER).write_text(marker.text(kind.name, files, {f: marker.file_hash(staged / f) for f in files}))
        _install(staged, dst, entries, old)
    finally:
        if staged.exists():
            shutil.rmtree(staged)
        for p in made:  # on a failure, the parents this export created go again
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    log(f"exported {len(files)} files to {dst} (a {kind.name} record)"
        + (f"; {kind.verified}" if verify and kind.verify else ""))
    return files
