"""`sanlab record export STUDY_DIR RECORD_DIR`: copy what a record's tables and report are
computed from, without checkpoints or data shards, with paths made relative."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable

from sanlab.records.common import (
    DATA_FILES,
    REPORT,
    RUN_FILES,
    STUDY,
    RecordError,
    copy_file,
    read_json,
    write_text,
)
from sanlab.records.load import study_tables

# --------------------------------------------------------------------------- export


def _rel_run_path(value: Any, study_dir: Path) -> Any:
    """An analysis run path, as `runs/RUN_ID` (relative to the study dir) when the run is the study's."""
    if isinstance(value, str) and (study_dir / "runs" / Path(value).name).is_dir():
        return f"runs/{Path(value).name}"
    return value


def _portable_analysis(a: dict[str, Any], src_study: Path) -> dict[str, Any]:
    """analysis.json with its paths relative to the study dir (they were as the analysing
    shell saw them: relative to its cwd, or absolute)."""
    for run in (a.get("runs") or {}).values():
        if isinstance(run, dict) and "path" in run:
            run["path"] = _rel_run_path(run["path"], src_study)
    sample = a.get("sample")
    if isinstance(sample, dict):
        if sample.get("data_dir"):
            sample["data_dir"] = "data"
        if sample.get("entropy_floor_file"):
            sample["entropy_floor_file"] = "data/" + Path(str(sample["entropy_floor_file"])).name
    return a


def _portable_config(cfg: Any) -> Any:
    """A run config whose data dir is the study's `data/` (as `sanlab study run` writes it
    for a study that prepares its own data) rather than wherever the data lay."""
    if isinstance(cfg, dict) and isinstance(cfg.get("data"), dict) and cfg["data"].get("dir"):
        cfg["data"]["dir"] = "../../data"
    return cfg


def _absolute_strings(obj: Any) -> Iterable[str]:
    if isinstance(obj, str) and obj.startswith("/") and len(obj) > 1:
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _absolute_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _absolute_strings(v)


def export(study_dir: str | Path, record_dir: str | Path, *, verify: bool = True,
           log: Callable[[str], Any] = print) -> list[Path]:
    """Copy into `record_dir/study/` what the tables and the report are computed from
    (no checkpoints, no data shards) and the report into `record_dir/report/`.

    Paths inside the copy are made relative to the exported study dir: the analysis
    files' run paths become `runs/RUN_ID`, their data paths `data/…`, an explicit
    `data.dir` of the spec is dropped (the study then reads its own `data/`) and the run
    configs' data dir becomes `../../data`. With `verify`, `sanlab study table --json`
    must give the same tables on the copy as on the original. Returns the files written.
    """
    src = Path(study_dir)
    dst = Path(record_dir) / STUDY
    if not (src / "study.json").is_file():
        raise RecordError(f"{src} is not a study dir (no study.json)")
    if not (src / "results.jsonl").is_file():
        raise RecordError(f"{src} has no results store (results.jsonl)")
    if dst.exists() and dst.resolve() == src.resolve():
        raise RecordError(f"{dst} is the study dir itself; export to another record dir")
    spec_raw = read_json(src / "study.json")
    if not isinstance(spec_raw, dict):
        raise RecordError(f"{src / 'study.json'}: not a study spec")
    data_src = Path(spec_raw.get("data", {}).get("dir") or src / "data")
    if not data_src.is_absolute() and spec_raw.get("data", {}).get("dir"):
        data_src = Path.cwd() / data_src
    if dst.exists():
        shutil.rmtree(dst)
    written: list[Path] = []

    spec_out = json.loads(json.dumps(spec_raw))
    spec_out.get("data", {}).pop("dir", None)
    write_text(dst / "study.json", json.dumps(spec_out, indent=2) + "\n")
    written.append(dst / "study.json")
    lines = []
    for raw in (src / "results.jsonl").read_text(errors="replace").splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            lines.append(raw)  # kept as it is: the store skips it, the report counts it
            continue
        if isinstance(rec, dict) and "config" in rec:
            rec["config"] = _portable_config(rec["config"])
        if isinstance(rec, dict) and isinstance(rec.get("run_dir"), str):
            rec["run_dir"] = _rel_run_path(rec["run_dir"], src)
        lines.append(json.dumps(rec, sort_keys=True))
    write_text(dst / "results.jsonl", "\n".join(lines) + ("\n" if lines else ""))
    written.append(dst / "results.jsonl")
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
            out = dst / "runs" / run.name / name
            if name == "config.json":
                write_text(out, json.dumps(_portable_config(read_json(f)), indent=1) + "\n", like=f)
            else:
                copy_file(f, out)
            written.append(out)
    for f in sorted((src / "analysis").rglob("*")) if (src / "analysis").is_dir() else []:
        if not f.is_file() or f.suffix not in (".json", ".csv"):
            continue
        out = dst / f.relative_to(src)
        if f.name == "analysis.json":
            write_text(out, json.dumps(_portable_analysis(read_json(f), src), indent=1) + "\n", like=f)
        else:
            copy_file(f, out)
        written.append(out)
    for name in DATA_FILES:
        if (data_src / name).is_file():
            copy_file(data_src / name, dst / "data" / name)
            written.append(dst / "data" / name)
    if not (dst / "data" / "manifest.json").is_file():
        log(f"warning: no data manifest found at {data_src}; the record has no data/manifest.json")
    if (src / REPORT).is_dir():
        rep = Path(record_dir) / REPORT
        if rep.exists():
            shutil.rmtree(rep)
        for f in sorted((src / REPORT).rglob("*")):
            if f.is_file():
                copy_file(f, rep / f.relative_to(src / REPORT))
                written.append(rep / f.relative_to(src / REPORT))
    for f in written:
        if f.suffix in (".json", ".jsonl"):
            texts = f.read_text().splitlines() if f.suffix == ".jsonl" else [f.read_text()]
            found = set()
            for t in texts:
                try:
                    found.update(_absolute_strings(json.loads(t)))
                except json.JSONDecodeError:
                    pass
            for p in sorted(found):
                log(f"warning: {f} holds an absolute path: {p}")
    if verify:
        a, b = study_tables(src), study_tables(dst)
        if a != b:
            raise RecordError(f"the exported copy's tables differ from {src}'s; the export is incomplete")
        log(f"exported {len(written)} files to {record_dir}; `sanlab study table` gives the same tables")
    return written

