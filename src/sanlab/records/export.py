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

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

from sanlab.paths import check_out_dir, check_path, is_run_dir
from sanlab.records import marker
from sanlab.records.common import (
    DATA_FILES,
    MARKER,
    REPORT,
    RUN_FILES,
    STUDY,
    RecordError,
    copy_file,
    read_json,
    write_text,
)
from sanlab.records.study import damaged_lines, damaged_text, study_tables
from sanlab.study.store import STORE_NAME, ResultStore

Log = Callable[[str], Any]


# --------------------------------------------------------------------------- a study's copy


def _rel_run_path(value: Any, study_dir: Path) -> Any:
    """An analysis run path, as `runs/RUN_ID` (relative to the study dir) when the run is the study's."""
    if isinstance(value, str) and (study_dir / "runs" / Path(value).name).is_dir():
        return f"runs/{Path(value).name}"
    return value


def _portable_analysis(a: dict[str, Any], src_study: Path, slugs: Iterable[str] = ()) -> dict[str, Any]:
    """analysis.json with its paths relative to the study dir (they were as the analysing
    shell saw them: relative to its cwd, or absolute); on a data axis (`slugs`, the data
    points' names) the sample's data dir is the point's own, `data/SLUG`."""
    for run in (a.get("runs") or {}).values():
        if isinstance(run, dict) and "path" in run:
            run["path"] = _rel_run_path(run["path"], src_study)
    sample = a.get("sample")
    if isinstance(sample, dict):
        name = Path(str(sample.get("data_dir") or "")).name
        data = f"data/{name}" if name in set(slugs) else "data"
        if sample.get("data_dir"):
            sample["data_dir"] = data
        if sample.get("entropy_floor_file"):
            sample["entropy_floor_file"] = f"{data}/" + Path(str(sample["entropy_floor_file"])).name
    return a


def _portable_config(cfg: Any, point: str = "") -> Any:
    """A run config whose data dir is the study's `data/` (as `sanlab study run` writes it
    for a study that prepares its own data; `data/SLUG/` for a value of a data axis)
    rather than wherever the data lay."""
    if isinstance(cfg, dict) and isinstance(cfg.get("data"), dict) and cfg["data"].get("dir"):
        cfg["data"]["dir"] = f"../../data/{point}" if point else "../../data"
    return cfg


def _portable_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with its data in the record's own `study/data/`: a study that prepared its
    corpus (`data.corpus`) reads `data/` by default, so an explicit `data.dir` is dropped;
    one that trained on an existing dir keeps `data.dir`, as `data` (the study dir's own)."""
    out = json.loads(json.dumps(spec))
    data = out.get("data")
    if isinstance(data, dict) and data.get("dir"):
        if data.get("corpus"):
            data.pop("dir")
        else:
            data["dir"] = "data"
    return out


def _absolute_strings(obj: Any) -> Iterable[str]:
    if isinstance(obj, str) and obj.startswith("/") and len(obj) > 1:
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _absolute_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _absolute_strings(v)


def study_entries(src: Path) -> list[str]:
    return [STUDY] + ([REPORT] if (src / REPORT).is_dir() else [])


def copy_study(src: Path, out: Path, log: Log) -> list[str]:
    """Write into `out/study/` what the tables and the report are computed from and into
    `out/report/` the study's report; the files written, relative to `out`."""
    dst = out / STUDY
    spec_raw = read_json(src / "study.json")
    if not isinstance(spec_raw, dict):
        raise RecordError(f"{src / 'study.json'}: not a study spec")
    explicit = (spec_raw.get("data") or {}).get("dir")
    data_src = Path(explicit) if explicit else src / "data"  # a relative data.dir is the cwd's, as `study run` read it
    written: list[Path] = []
    point_of: dict[str, str] = {}  # run id -> its data point's slug
    data_points: dict[str, Path] = {}  # data slug -> where its prepared dir lay

    def data_dir_of(rec: dict[str, Any]) -> Path:
        where = Path(str(rec.get("dir") or "data"))
        return where if where.is_absolute() else src / where

    bad = damaged_lines(src)
    if bad:  # a record is built from whole results only: its tables would silently lack these runs
        torn = bad == [bad[-1]] and not (src / STORE_NAME).read_bytes().endswith(b"\n")
        raise RecordError(f"{src / STORE_NAME}: {damaged_text(bad)} damaged"
                          + (" (a torn last line: an append cut short by a kill)" if torn else "")
                          + "; `sanlab study run` on the study moves it aside (and reruns what it lost), "
                          "or remove it by hand; nothing was exported")
    write_text(dst / "study.json", json.dumps(_portable_spec(spec_raw), indent=2) + "\n")
    written.append(dst / "study.json")
    lines = []
    for rec in ResultStore(src).records():
        if "config" in rec:
            rec["config"] = _portable_config(rec["config"], rec.get("data") or "")
            point_of[str(rec.get("run_id"))] = rec.get("data") or ""
        if isinstance(rec.get("run_dir"), str):
            rec["run_dir"] = _rel_run_path(rec["run_dir"], src)
        if rec.get("type") == "data":  # the prepared dir, as the copy holds it
            rec["dir"] = f"data/{rec['data']}" if rec.get("data") else "data"
            data_points[str(rec.get("data") or "")] = data_dir_of(rec)
        lines.append(json.dumps(rec, sort_keys=True).encode())
    dst.mkdir(parents=True, exist_ok=True)
    (dst / STORE_NAME).write_bytes(b"".join(line + b"\n" for line in lines))
    written.append(dst / STORE_NAME)
    if (src / "speed.json").is_file():
        copy_file(src / "speed.json", dst / "speed.json")
        written.append(dst / "speed.json")
    for run in sorted((src / "runs").iterdir()) if (src / "runs").is_dir() else []:
        if not run.is_dir():
            continue
        for name in RUN_FILES:
            f = run / name
            if not f.is_file():
                continue
            target = dst / "runs" / run.name / name
            if name == "config.json":
                write_text(target, json.dumps(_portable_config(read_json(f), point_of.get(run.name, "")), indent=1)
                           + "\n", like=f)
            else:
                copy_file(f, target)
            written.append(target)
        for f in sorted((run / "eval").glob("results-*.json")) if (run / "eval").is_dir() else []:
            copy_file(f, dst / "runs" / run.name / "eval" / f.name)  # `sanlab eval`'s zero-shot results
            written.append(dst / "runs" / run.name / "eval" / f.name)
    for f in sorted((src / "analysis").rglob("*")) if (src / "analysis").is_dir() else []:
        if not f.is_file() or f.suffix not in (".json", ".csv"):
            continue
        target = dst / f.relative_to(src)
        if f.name == "analysis.json":
            write_text(target, json.dumps(_portable_analysis(read_json(f), src, [k for k in data_points if k]),
                                          indent=1) + "\n", like=f)
        else:
            copy_file(f, target)
        written.append(target)
    axis = {k: v for k, v in data_points.items() if k}
    for slug, where in (axis.items() if axis else [("", data_src)]):
        into = dst / "data" / slug if slug else dst / "data"
        for name in DATA_FILES:
            if (where / name).is_file():
                copy_file(where / name, into / name)
                written.append(into / name)
        if not (into / "manifest.json").is_file():
            log(f"warning: no data manifest found at {where}; the record has no "
                f"{(into / 'manifest.json').relative_to(dst).as_posix()}")
    if (src / REPORT).is_dir():
        for f in sorted((src / REPORT).rglob("*")):
            if f.is_file():
                copy_file(f, out / REPORT / f.relative_to(src / REPORT))
                written.append(out / REPORT / f.relative_to(src / REPORT))
    for f in written:
        if f.suffix in (".json", ".jsonl"):
            found: set[str] = set()
            for raw in f.read_bytes().split(b"\n") if f.suffix == ".jsonl" else [f.read_bytes()]:
                try:
                    found.update(_absolute_strings(json.loads(raw)))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    pass
            for p in sorted(found):
                log(f"warning: {f.relative_to(out)} holds an absolute path: {p}")
    return [f.relative_to(out).as_posix() for f in written]


def verify_study(src: Path, out: Path) -> None:
    """The copy's tables (`sanlab study table --json`) must equal the original's."""
    if study_tables(src) != study_tables(out / STUDY):
        raise RecordError(f"the exported copy's tables differ from {src}'s; nothing was exported")


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
        old = marker.read(dst)
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
    # lazy: import cycle (sanlab.records.kinds imports this module)
    from sanlab.records.kinds import kind_of_source

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
