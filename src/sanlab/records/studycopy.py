"""What a matched, axis or variants record holds of its study: the files its tables and
report are computed from (no checkpoints, no data shards), with paths made relative
(`copy_study`), and the check that the copy gives the same tables (`verify_study`).

The kinds of record (`sanlab.records.kinds`) name these as their `copy` and `verify`;
`sanlab.records.export` decides where a copy may go and installs it. Imports go one way:
export → kinds → studycopy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from sanlab.records.common import DATA_FILES, REPORT, RUN_FILES, STUDY, RecordError, copy_file, read_json, write_text
from sanlab.records.study import damaged_lines, damaged_text, study_tables
from sanlab.study.store import STORE_NAME, ResultStore

Log = Callable[[str], Any]


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
        if rec.get("type") == "data":  # where the prepared dir lay, then the dir as the copy holds it
            data_points[str(rec.get("data") or "")] = data_dir_of(rec)
            rec["dir"] = f"data/{rec['data']}" if rec.get("data") else "data"
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
