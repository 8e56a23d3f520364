#!/usr/bin/env python3
"""Committed record studies: export a finished study dir, and keep the record's README
tables equal to its committed results.

A record is a directory `records/NAME/`:

    README.md      hand-written prose around generated blocks, each between
                   `<!-- records:BEGIN NAME -->` and `<!-- records:END NAME -->`
    record.toml    optional: `compare_with = "OTHER-RECORD"` (a sibling record whose
                   iso-param gap this one's is compared with) and `prediction = "…"`
                   (written before the run, shown beside the comparison)
    study/         the study dir without checkpoints or data shards (`export`)
    report/        `sanlab report study --out report`

    python scripts/records.py export STUDY_DIR RECORD_DIR   # copy what the tables need
    python scripts/records.py readme RECORD_DIR             # rewrite the README's blocks
    python scripts/records.py readme RECORD_DIR --check     # exit 1 naming stale blocks

Blocks: gaps, floor, regions, exercises, identity, crystallisation, claims (see `BLOCKS`).

Sign convention: Δ = arm − reference validation loss in nats, the reference being the
SAN; Δ < 0 means the standard arm is ahead. The paper (SPEC §1.6) writes SAN − FFN, so
its numbers are shown here negated: its iso-param +0.0055 "in FFN's favour" is −0.0055.

Verdict rules of the `claims` block (each claim is reproduced, not reproduced or
inconclusive; `T` is the noise threshold at the budget concerned: 2 × the largest |Δ|
of the noise-floor pair's seeds, from the pair at that budget or, when it ran at one
budget only, the nearest one; no noise pair means every aggregate comparison is
inconclusive). A per-seed-pair quantity x_s (a region or exercise Δ, or a difference of
two) "is below 0" when there are ≥ 2 seed pairs and mean(x) < −2·sd(x), "above 0" when
mean(x) > 2·sd(x), else undetermined:

- ordering: at the largest budget, reproduced when Δ(iso-depth) < Δ(iso-FLOP) − T and
  Δ(iso-FLOP) < Δ(iso-param) − T; not reproduced when either step is reversed by more
  than T; else inconclusive (also when an arm is missing).
- iso-param gap shrinking: reproduced when |Δ| at the smallest final budget exceeds |Δ|
  at the largest by more than T and no step to a larger budget grows |Δ| by more than T;
  not reproduced when |Δ| at the largest exceeds the smallest's by more than T; else
  inconclusive (also with one budget).
- deficit on query tokens (iso-param arm, largest budget): with per seed pair
  q − t (query Δ − trace Δ) and q − a (query Δ − aggregate Δ): reproduced when both are
  below 0; not reproduced when either is above 0; else inconclusive.
- recall vs context-grounded types: R_s, C_s the token-weighted mean Δ over the recall
  types (`sanlab.data.synth.RECALL_TYPES`) and over the other (context-grounded) types;
  reproduced when R is below 0 and C above 0; not reproduced when R is above 0 or C
  below 0; else inconclusive (also without exercise types).
- region identity: reproduced when every analysed pair's token-weighted sum of region
  Δs is within 2% (relative) of its aggregate Δ; not reproduced when any is not;
  inconclusive without analysed pairs.
- Q/K before V/O/FFN-down: per analysed run at the largest budget, "before" when the
  later of Q and K settles at an earlier milestone than the earliest of V, O and down
  (never settling counts as after the last milestone; neither side settling decides
  nothing); reproduced when every deciding run says before, not reproduced when none
  does, else inconclusive (also when no run decides).
- real text vs the embedded corpus (only with `compare_with`): reproduced when
  |Δ iso-param| here exceeds the compared record's (each at its largest budget) by more
  than T = the larger of the two records' thresholds; not reproduced when it is smaller
  by more than T; else inconclusive.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from sanlab.errors import DataError, SanlabError

STUDY = "study"
REPORT = "report"
README = "README.md"
CONFIG = "record.toml"
DATA_FILES = ("manifest.json", "entropy_floor.json", "tokenizer.json")  # the small files of a data dir
RUN_FILES = ("config.json", "meta.json", "metrics.jsonl")
TOP_FILES = ("study.json", "results.jsonl", "speed.json")
CONFIG_KEYS = {"compare_with", "prediction"}

# The paper's numbers (SPEC §1.6) in this project's sign: Δ = standard arm − SAN.
PAPER_GAP = {"iso-param": -0.0055, "iso-FLOP": -0.263, "iso-depth": -0.470}
PAPER_GAP_TEXT = {
    "iso-param": "−0.0055 at 105B (−0.046 at 5B, −0.019 at 30B)",
    "iso-FLOP": "−0.263 at 105B",
    "iso-depth": "−0.470 at 105B",
}
PAPER_ISO_PARAM_BY_BUDGET = {5_000_000_000: -0.046, 30_000_000_000: -0.019, 105_000_000_000: -0.0055}
REGIONS = ("query", "trace", "answer", "other")
PAPER_TOKEN_SHARE = {"query": 5.8, "trace": 57.2, "answer": 35.9}
PAPER_LOSS_SHARE = {"query": 7.9, "trace": 55.4, "answer": 36.6}
PAPER_REGION_DELTA = {
    "query": "−0.052 (31B), −0.038 (105B)",
    "trace": "−0.008 (31B); favours the SAN at 105B",
    "answer": "favours the SAN at 105B",
}
MATRIX_TYPES = ("Q", "K", "V", "O", "down")
ROUTING, CONTENT = ("Q", "K"), ("V", "O", "down")
IDENTITY_TOL = 0.02

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

RULES = {
    "ordering": "ordering: reproduced when Δ(iso-depth) < Δ(iso-FLOP) − T and Δ(iso-FLOP) < Δ(iso-param) − T "
                "at the largest budget; not reproduced when a step is reversed by more than T; else inconclusive.",
    "shrinking": "iso-param gap shrinking: reproduced when |Δ| falls by more than T from the smallest to the "
                 "largest final budget with no step growing by more than T; not reproduced when it grows by "
                 "more than T; else inconclusive.",
    "query": "query deficit: reproduced when (query Δ − trace Δ) and (query Δ − aggregate Δ) are both below 0; "
             "not reproduced when either is above 0; else inconclusive.",
    "exercise": "recall vs context-grounded: reproduced when the recall types' token-weighted Δ is below 0 and "
                "the context-grounded types' above 0; not reproduced when the first is above 0 or the second "
                "below 0; else inconclusive.",
    "identity": "region identity: reproduced when every analysed pair's token-weighted sum of region Δs is "
                "within 2% of its aggregate Δ; not reproduced otherwise; inconclusive without analysed pairs.",
    "crystallisation": "Q/K before V/O/FFN-down: reproduced when in every analysed run that decides it the later "
                       "of Q, K settles before the earliest of V, O, down; not reproduced when in none; else "
                       "inconclusive.",
    "compare": "real text vs embedded corpus: reproduced when |Δ iso-param| here exceeds the compared record's by "
               "more than T (the larger record threshold); not reproduced when smaller by more than T; else "
               "inconclusive.",
}
RULES_PREAMBLE = ("T = 2 × the largest |Δ| of the noise-floor pair's seeds at that budget (the nearest budget the "
                  "pair ran at). A per-seed-pair quantity is below / above 0 only with ≥ 2 seed pairs and "
                  "|mean| > 2 × its sd; a difference within these bounds is inconclusive.")


class RecordError(DataError):
    """A missing or corrupt study dir, record dir or README."""


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not readable JSON ({e})") from None


def _write_text(path: Path, text: str, like: Path | None = None) -> None:
    """Atomic write; keeps `like`'s modification time (the report orders analyses by it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    if like is not None:
        st = like.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


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
    spec_raw = _read_json(src / "study.json")
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
    _write_text(dst / "study.json", json.dumps(spec_out, indent=2) + "\n")
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
    _write_text(dst / "results.jsonl", "\n".join(lines) + ("\n" if lines else ""))
    written.append(dst / "results.jsonl")
    if (src / "speed.json").is_file():
        _copy(src / "speed.json", dst / "speed.json")
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
                _write_text(out, json.dumps(_portable_config(_read_json(f)), indent=1) + "\n", like=f)
            else:
                _copy(f, out)
            written.append(out)
    for f in sorted((src / "analysis").rglob("*")) if (src / "analysis").is_dir() else []:
        if not f.is_file() or f.suffix not in (".json", ".csv"):
            continue
        out = dst / f.relative_to(src)
        if f.name == "analysis.json":
            _write_text(out, json.dumps(_portable_analysis(_read_json(f), src), indent=1) + "\n", like=f)
        else:
            _copy(f, out)
        written.append(out)
    for name in DATA_FILES:
        if (data_src / name).is_file():
            _copy(data_src / name, dst / "data" / name)
            written.append(dst / "data" / name)
    if not (dst / "data" / "manifest.json").is_file():
        log(f"warning: no data manifest found at {data_src}; the record has no data/manifest.json")
    if (src / REPORT).is_dir():
        rep = Path(record_dir) / REPORT
        if rep.exists():
            shutil.rmtree(rep)
        for f in sorted((src / REPORT).rglob("*")):
            if f.is_file():
                _copy(f, rep / f.relative_to(src / REPORT))
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


# --------------------------------------------------------------------------- loading


def study_tables(study_dir: Path) -> dict[str, Any]:
    """What `sanlab study table DIR --json` prints (computed in this process)."""
    from sanlab.study.cli import table_json

    return json.loads(json.dumps(table_json(study_dir)))  # exactly the printed JSON's types


@dataclass
class Record:
    """A record dir's study as plain data."""

    dir: Path
    spec: dict[str, Any]
    tables: dict[str, Any]
    analyses: list[dict[str, Any]]  # path order; a later file wins for the same pair
    floor: dict[str, Any] | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def study(self) -> Path:
        return self.dir / STUDY

    @property
    def optimizer(self) -> str:
        return str(self.spec.get("optimizers", ["muon"])[0])

    @property
    def budgets(self) -> list[int]:
        return sorted({int(g["tokens"]) for g in self.tables["gaps"] if g["optimizer"] == self.optimizer})

    @property
    def largest(self) -> int | None:
        return self.budgets[-1] if self.budgets else None

    def gaps_at(self, tokens: int | None) -> list[dict[str, Any]]:
        return [g for g in self.tables["gaps"] if g["optimizer"] == self.optimizer and g["tokens"] == tokens]

    def gap(self, role: str, tokens: int | None) -> dict[str, Any] | None:
        return next((g for g in self.gaps_at(tokens) if g["role"] == role), None)

    def runs(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for a in self.analyses:
            out.update(a.get("runs") or {})
        return out

    def comparisons(self) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for a in self.analyses:
            for c in a.get("comparisons") or []:
                if isinstance(c, dict) and isinstance(c.get("run"), str) and isinstance(c.get("vs"), str):
                    out[(c["run"], c["vs"])] = c
        return out

    def pairs(self, gap: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Seed -> the analysed comparison of this gap's seed pair (only those analysed)."""
        comps = self.comparisons()
        out = {}
        for seed, ids in sorted((gap.get("runs") or {}).items(), key=lambda kv: int(kv[0])):
            c = comps.get((ids["arm"], ids["reference"]))
            if c is not None:
                out[int(seed)] = c
        return out


def load_config(record_dir: Path) -> dict[str, Any]:
    path = record_dir / CONFIG
    if not path.is_file():
        return {}
    try:
        cfg = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise RecordError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise RecordError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(CONFIG_KEYS))})")
    for k, v in cfg.items():
        if not isinstance(v, str) or not v.strip():
            raise RecordError(f"{path}: {k} must be a non-empty string")
    return cfg


def load(record_dir: str | Path) -> Record:
    """Read a record dir; `RecordError` (one line) when it is missing or corrupt."""
    d = Path(record_dir)
    study = d / STUDY
    if not d.is_dir():
        raise RecordError(f"{d}: no such record dir")
    if not (study / "study.json").is_file():
        raise RecordError(f"{d}: not a record (no {STUDY}/study.json); run `records.py export` first")
    spec = _read_json(study / "study.json")
    if not isinstance(spec, dict):
        raise RecordError(f"{study / 'study.json'}: not a study spec")
    if not (study / "results.jsonl").is_file():
        raise RecordError(f"{study}: no results store (results.jsonl)")
    try:
        tables = study_tables(study)
    except SanlabError as e:
        raise RecordError(f"{study}: {e}") from None
    analyses = []
    for path in sorted((study / "analysis").glob("*/analysis.json")):
        a = _read_json(path)
        if not isinstance(a, dict) or not isinstance(a.get("runs"), dict):
            raise RecordError(f"{path}: not an analysis file")
        analyses.append(a)
    floor = None
    if (study / "data" / "entropy_floor.json").is_file():
        floor = _read_json(study / "data" / "entropy_floor.json")
        if not isinstance(floor, dict) or "splits" not in floor:
            raise RecordError(f"{study / 'data' / 'entropy_floor.json'}: not an entropy-floor file")
    return Record(d, spec, tables, analyses, floor, load_config(d))


# --------------------------------------------------------------------------- numbers and rules


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_sd(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def sign_of(xs: list[float]) -> int:
    """-1 when the per-seed-pair values are below 0 (≥ 2 of them, mean < −2·sd), +1 when
    above 0 (mean > 2·sd), 0 when undetermined."""
    if len(xs) < 2:
        return 0
    m, sd = mean_sd(xs)
    assert m is not None and sd is not None
    if m < -2 * sd:
        return -1
    if m > 2 * sd:
        return 1
    return 0


def noise_threshold(rec: Record, tokens: int | None) -> float | None:
    """T = 2 × the largest |Δ| of the noise-floor pair's seeds at `tokens` (or at the
    nearest budget the pair ran at); None without a finished noise pair."""
    pairs = [n for n in rec.tables.get("noise_floor", []) if n.get("per_seed")]
    if not pairs or tokens is None:
        return None
    n = min(pairs, key=lambda n: (abs(math.log(n["tokens"] / tokens)), n["tokens"]))
    return 2 * max(abs(v) for v in n["per_seed"].values())


def noise_pair(rec: Record, tokens: int | None) -> dict[str, Any] | None:
    pairs = [n for n in rec.tables.get("noise_floor", []) if n.get("per_seed")]
    if not pairs or tokens is None:
        return None
    return min(pairs, key=lambda n: (abs(math.log(n["tokens"] / tokens)), n["tokens"]))


def verdict_ordering(d_param: float | None, d_flop: float | None, d_depth: float | None,
                     t: float | None) -> str:
    """Paper: iso-depth gap > iso-FLOP gap > iso-param gap, i.e. Δ(depth) < Δ(flop) < Δ(param)."""
    if None in (d_param, d_flop, d_depth, t):
        return INCONCLUSIVE
    assert d_param is not None and d_flop is not None and d_depth is not None and t is not None
    steps = (d_flop - d_depth, d_param - d_flop)  # each > T when the order holds
    if all(s > t for s in steps):
        return REPRODUCED
    if any(s < -t for s in steps):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_shrinking(series: list[tuple[int, float]], t: float | None) -> str:
    """`series`: (budget, iso-param mean Δ) sorted by budget."""
    if len(series) < 2 or t is None:
        return INCONCLUSIVE
    mags = [abs(d) for _, d in series]
    if mags[-1] - mags[0] > t:
        return NOT_REPRODUCED
    if mags[0] - mags[-1] > t and all(b - a <= t for a, b in zip(mags, mags[1:])):
        return REPRODUCED
    return INCONCLUSIVE


def verdict_query(q_minus_t: list[float], q_minus_agg: list[float]) -> str:
    s1, s2 = sign_of(q_minus_t), sign_of(q_minus_agg)
    if s1 == -1 and s2 == -1:
        return REPRODUCED
    if s1 == 1 or s2 == 1:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_exercise(recall: list[float], context: list[float]) -> str:
    r, c = sign_of(recall), sign_of(context)
    if r == -1 and c == 1:
        return REPRODUCED
    if r == 1 or c == -1:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_identity(rel_errors: list[float]) -> str:
    if not rel_errors:
        return INCONCLUSIVE
    return REPRODUCED if all(e <= IDENTITY_TOL for e in rel_errors) else NOT_REPRODUCED


def settles_before(milestones: dict[str, float | None]) -> bool | None:
    """Whether the routing matrices (the later of Q, K) settle before the earliest content
    matrix (V, O, down) in one run; None when neither side settles or a side is absent."""
    inf = math.inf
    routing = [milestones[t] for t in ROUTING if t in milestones]
    content = [milestones[t] for t in CONTENT if t in milestones]
    if not routing or not content:
        return None
    r = max(inf if m is None else m for m in routing)
    c = min(inf if m is None else m for m in content)
    if r == inf and c == inf:
        return None
    return r < c


def verdict_crystallisation(decisions: list[bool | None]) -> str:
    decided = [d for d in decisions if d is not None]
    if not decided:
        return INCONCLUSIVE
    if all(decided):
        return REPRODUCED
    if not any(decided):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_compare(here: float | None, there: float | None, t: float | None) -> str:
    if None in (here, there, t):
        return INCONCLUSIVE
    assert here is not None and there is not None and t is not None
    diff = abs(here) - abs(there)
    if diff > t:
        return REPRODUCED
    if diff < -t:
        return NOT_REPRODUCED
    return INCONCLUSIVE


# --------------------------------------------------------------------------- rendering helpers


def fmt(x: float | None, f: str = "{:+.4f}") -> str:
    return "–" if x is None or not _finite(x) else f.format(x).replace("-", "−")


def fmt_ms(xs: list[float]) -> str:
    m, sd = mean_sd(xs)
    if m is None:
        return "–"
    return fmt(m) + ("" if sd is None else f" ± {sd:.4f}")


def fmt_tokens(n: int) -> str:
    from sanlab.config import format_tokens

    return format_tokens(n)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def arm_label(g: dict[str, Any]) -> str:
    return f"{g['arm']} ({g['role']})"


def _per_seed(g: dict[str, Any]) -> list[float]:
    return [float(v) for _, v in sorted(g.get("per_seed", {}).items(), key=lambda kv: int(kv[0]))]


def _per_seed_text(g: dict[str, Any] | None) -> str:
    if g is None or not g.get("per_seed"):
        return "–"
    return " ".join(f"s{s}: {fmt(v)}" for s, v in sorted(g["per_seed"].items(), key=lambda kv: int(kv[0])))


def _rows(c: dict[str, Any], grouping: str) -> dict[str, dict[str, Any]]:
    return {r["group"]: r for r in ((c.get(grouping) or {}).get("rows") or [])}


SIGN_NOTE = ("Δ = arm − SAN validation loss (nats); Δ < 0: the standard arm is ahead. The paper writes "
             "SAN − FFN; its numbers are shown negated to this sign.")


# --------------------------------------------------------------------------- blocks


def block_gaps(rec: Record) -> str:
    """Per final budget × arm: losses, Δ per seed, mean ± sd, the noise pair, the verdict, the paper."""
    ref = rec.tables["gaps"][0]["reference"] if rec.tables["gaps"] else "san"
    rows = []
    opts = [str(o) for o in rec.spec.get("optimizers", [rec.optimizer])]
    def order(g: dict[str, Any]) -> tuple[int, int]:
        return (opts.index(g["optimizer"]) if g["optimizer"] in opts else len(opts), int(g["tokens"]))

    for g in sorted(rec.tables["gaps"], key=order):
        tokens = int(g["tokens"])
        noise = noise_pair(rec, tokens)
        at = "" if noise is None or noise["tokens"] == tokens else f" (at {fmt_tokens(noise['tokens'])})"
        rows.append([fmt_tokens(tokens), arm_label(g), g["label"], g["optimizer"],
                     fmt(g.get("reference_loss"), "{:.4f}"), fmt(g.get("arm_loss"), "{:.4f}"), _per_seed_text(g),
                     fmt_ms(_per_seed(g)), _per_seed_text(noise) + at, g.get("verdict", "–"),
                     PAPER_GAP_TEXT.get(g["role"], "–")])
    if not rows:
        return "No final gaps in the results store yet."
    head = [f"{SIGN_NOTE} Noise pair: {ref} with its norm swapped, same seeds. The other blocks and the "
            f"claims read the first optimizer ({rec.optimizer})."]
    return "\n\n".join(head + [md_table(
        ["budget", "arm", "config", "optimizer", f"{ref} loss", "arm loss", "Δ per seed", "Δ mean ± sd",
         "noise-pair Δ per seed", "verdict (study table)", "paper (105B unless noted)"], rows)])


def _val_floor(rec: Record) -> float | None:
    if rec.floor is None:
        return None
    v = ((rec.floor.get("splits") or {}).get("val") or {}).get("nats_per_token")
    return float(v) if _finite(v) else None


def _mean_loss(rec: Record, role: str, tokens: int) -> float | None:
    if role == "reference":
        vals = [g.get("reference_loss") for g in rec.gaps_at(tokens)]
        vals = [v for v in vals if _finite(v)]
        return vals[0] if vals else None
    g = rec.gap(role, tokens)
    return g.get("arm_loss") if g else None


def block_floor(rec: Record) -> str:
    """Per arm at each budget: loss, the corpus's entropy floor, loss above it, change with budget."""
    floor = _val_floor(rec)
    if not rec.budgets:
        return "No final runs yet."
    t_max = noise_threshold(rec, rec.largest)
    ref = rec.tables["gaps"][0]["reference"]
    arms = [("reference", ref)] + [(g["role"], arm_label(g)) for g in rec.gaps_at(rec.largest)]
    rows, summary = [], []
    for role, label in arms:
        prev = None
        for tokens in rec.budgets:
            loss = _mean_loss(rec, role, tokens)
            change = None if loss is None or prev is None else loss - prev
            if change is None:
                falling = "–"
            else:
                t = noise_threshold(rec, tokens)
                falling = "yes" if t is not None and change < -t else ("no" if t is not None else "–")
            rows.append([label, fmt_tokens(tokens), fmt(loss, "{:.4f}"), fmt(floor, "{:.4f}"),
                         fmt(None if loss is None or floor is None else loss - floor, "{:.4f}"),
                         fmt(change), falling])
            prev = loss if loss is not None else prev
        loss = _mean_loss(rec, role, rec.largest or 0)
        summary.append((label, None if loss is None or floor is None else loss - floor, rows[-1][6]))
    if floor is None:
        head = "This corpus has no entropy floor (data/entropy_floor.json is absent): loss above floor is not defined."
    else:
        head = (f"Entropy floor of the validation split: {floor:.4f} nats/token (data/entropy_floor.json; a lower "
                "bound on any model's mean loss). Still falling: the loss dropped by more than T = 2 × the largest "
                f"|noise-pair Δ| since the previous budget (T = {fmt(t_max, '{:.4f}')} at the largest budget).")
    out = [head, md_table(["arm", "budget", "val loss (mean over seeds)", "entropy floor", "above floor",
                           "change vs previous budget", "still falling"], rows)]
    if floor is not None:
        if any(s[1] is None for s in summary) or t_max is None:
            above = "– (not every arm has a loss, or there is no noise pair)"
        else:
            above = "yes" if all(s[1] > t_max for s in summary) else "no"
        still = [s[0] for s in summary if s[2] == "yes"]
        unmeasured = [s[0] for s in summary if s[2] == "–"]
        falling = ("not measured (one final budget)" if len(rec.budgets) < 2
                   else (", ".join(still) if still else "none")
                   + (f" (not measured: {', '.join(unmeasured)})" if unmeasured else ""))
        out.append(f"At the largest budget ({fmt_tokens(rec.largest or 0)}): every arm above the floor by more "
                   f"than T: {above}; still falling: {falling}.")
    # The analysis's own per-region floor on the analysed sample.
    runs = rec.runs()
    reg_rows = []
    for role, label in arms:
        ids = _run_ids_at(rec, role, rec.largest)
        for region in REGIONS:
            vals = [r for rid in ids if rid in runs
                    for r in ((runs[rid].get("losses") or {}).get("region") or []) if r["group"] == region]
            if not vals or not any(_finite(v.get("entropy_floor")) for v in vals):
                continue
            reg_rows.append([label, region, fmt(statistics.fmean(v["loss"] for v in vals), "{:.4f}"),
                             fmt(statistics.fmean(v["entropy_floor"] for v in vals), "{:.4f}"),
                             fmt(statistics.fmean(v["loss_above_floor"] for v in vals), "{:.4f}")])
    if reg_rows:
        out.append(f"Per region at {fmt_tokens(rec.largest or 0)}, on the analysed validation sample "
                   "(`sanlab analyze`; mean over seeds):")
        out.append(md_table(["arm", "region", "loss", "entropy floor", "above floor"], reg_rows))
    return "\n\n".join(out)


def _run_ids_at(rec: Record, role: str, tokens: int | None) -> list[str]:
    """The final run ids of an arm (or of the reference) at a budget, by seed."""
    ids: dict[str, str] = {}
    for g in rec.gaps_at(tokens):
        if role == "reference" or g["role"] == role:
            for seed, pair in (g.get("runs") or {}).items():
                ids[seed] = pair["reference" if role == "reference" else "arm"]
    return [ids[s] for s in sorted(ids, key=int)]


def region_deltas(rec: Record, g: dict[str, Any]) -> dict[str, list[float]]:
    """Region -> Δ per analysed seed pair; plus "aggregate"."""
    out: dict[str, list[float]] = {}
    for _, c in rec.pairs(g).items():
        rows = _rows(c, "region")
        for region in REGIONS:
            if region in rows and _finite(rows[region].get("delta")):
                out.setdefault(region, []).append(float(rows[region]["delta"]))
        agg = ((c.get("region") or {}).get("identity") or {}).get("aggregate_delta")
        if _finite(agg):
            out.setdefault("aggregate", []).append(float(agg))
    return out


def block_regions(rec: Record) -> str:
    gaps = rec.gaps_at(rec.largest)
    if not gaps or not any(rec.pairs(g) for g in gaps):
        return "No analysed final pairs at the largest budget (run `sanlab report STUDY --analyze`)."
    ref_runs = rec.runs()
    ref_ids = [r for r in _run_ids_at(rec, "reference", rec.largest) if r in ref_runs]
    shares: dict[str, list[tuple[float, float]]] = {}
    for rid in ref_ids:
        for r in (ref_runs[rid].get("losses") or {}).get("region") or []:
            shares.setdefault(r["group"], []).append((r["token_share"], r["loss_share"]))
    deltas = {g["arm"]: region_deltas(rec, g) for g in gaps}
    rows = []
    for region in (*REGIONS, "aggregate"):
        sh = shares.get(region)
        row = [region,
               "–" if not sh else f"{100 * statistics.fmean(s[0] for s in sh):.1f}%",
               "–" if not sh else f"{100 * statistics.fmean(s[1] for s in sh):.1f}%",
               f"{PAPER_TOKEN_SHARE[region]:.1f}% / {PAPER_LOSS_SHARE[region]:.1f}%"
               if region in PAPER_TOKEN_SHARE else "–"]
        row += [fmt_ms(deltas[g["arm"]].get(region, [])) for g in gaps]
        row.append(PAPER_REGION_DELTA.get(region, "−0.0055 (105B)" if region == "aggregate" else "–"))
        rows.append(row)
    n = max(len(rec.pairs(g)) for g in gaps)
    head = (f"At {fmt_tokens(rec.largest or 0)}, on the analysed validation sample ({n} seed pair(s); "
            f"Δ mean ± sd over them). Token and loss shares are the SAN's. {SIGN_NOTE}")
    return "\n\n".join([head, md_table(
        ["region", "token share", "loss share (SAN)", "paper token / loss share"]
        + [f"Δ {arm_label(g)}" for g in gaps] + ["paper Δ (iso-param)"], rows)])


def exercise_deltas(rec: Record, g: dict[str, Any]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(exercise type -> Δ per analysed seed pair, type -> token share (mean))."""
    out: dict[str, list[float]] = {}
    share: dict[str, list[float]] = {}
    for _, c in rec.pairs(g).items():
        for name, r in _rows(c, "exercise").items():
            if _finite(r.get("delta")):
                out.setdefault(name, []).append(float(r["delta"]))
                share.setdefault(name, []).append(float(r["token_share"]))
    return out, {k: statistics.fmean(v) for k, v in share.items()}


def has_types(types: Iterable[str]) -> bool:
    """A corpus has exercise types when its documents fall into more than one."""
    return len(set(types)) > 1


def recall_types() -> tuple[str, ...]:
    from sanlab.data.synth import RECALL_TYPES

    return RECALL_TYPES


def block_exercises(rec: Record) -> str:
    gaps = rec.gaps_at(rec.largest)
    if not gaps or not any(rec.pairs(g) for g in gaps):
        return "No analysed final pairs at the largest budget (run `sanlab report STUDY --analyze`)."
    per = {g["arm"]: exercise_deltas(rec, g) for g in gaps}
    types: list[str] = []
    for d, _ in per.values():
        types += [t for t in d if t not in types]
    if not has_types(types):
        return "No exercise types in this corpus."
    recall = recall_types()
    share = per[gaps[0]["arm"]][1]
    rows = [[t, "recall" if t in recall else "context-grounded", f"{100 * share.get(t, 0.0):.1f}%"]
            + [fmt_ms(per[g["arm"]][0].get(t, [])) for g in gaps] for t in types]
    head = (f"At {fmt_tokens(rec.largest or 0)}, Δ per exercise type (mean ± sd over analysed seed pairs). "
            "Recall types need the weights (`RECALL_TYPES` of the generator); the others carry their "
            "material in the document. Paper: recall-heavy types favour FFN (Δ < 0 here), context-grounded "
            f"types (rag, editing, math) favour the SAN (Δ > 0 here). {SIGN_NOTE}")
    return "\n\n".join([head, md_table(["type", "kind", "token share"] + [f"Δ {arm_label(g)}" for g in gaps],
                                       rows)])


def identity_rows(rec: Record) -> list[tuple[str, int, str, dict[str, Any]]]:
    """(arm label, seed, budget text, the region identity plus `store_delta`: the seed
    pair's Δ on the full validation eval, from the results store) of every analysed pair."""
    out = []
    for tokens in rec.budgets:
        for g in rec.gaps_at(tokens):
            for seed, c in rec.pairs(g).items():
                ident = (c.get("region") or {}).get("identity")
                if ident:
                    store = (g.get("per_seed") or {}).get(str(seed))
                    out.append((arm_label(g), seed, fmt_tokens(tokens), {**ident, "store_delta": store}))
    return out


def block_identity(rec: Record) -> str:
    rows = [[label, budget, f"s{seed}", fmt(i.get("weighted_sum")), fmt(i.get("aggregate_delta")),
             fmt(i.get("store_delta")),
             fmt(None if i.get("rel_error") is None else 100 * i["rel_error"], "{:.4f}%")]
            for label, seed, budget, i in identity_rows(rec)]
    if not rows:
        return "No analysed final pairs."
    head = ("Per analysed pair: Σ token share × region Δ against the aggregate Δ on the same (analysed) "
            "tokens (paper: within 2%); beside them the pair's Δ on the run's own validation eval (results "
            "store), which the analysed sample estimates.")
    return "\n\n".join([head, md_table(["arm", "budget", "seed", "Σ share × region Δ", "aggregate Δ",
                                        "store Δ", "relative error"], rows)])


def crystallisation_of(rec: Record, run_id: str) -> dict[str, float | None] | None:
    sp = (rec.runs().get(run_id) or {}).get("spectra")
    if not sp or not sp.get("crystallisation"):
        return None
    return {c["type"]: c["milestone"] for c in sp["crystallisation"]}


def _crys_runs(rec: Record) -> list[tuple[str, list[tuple[int, dict[str, float | None]]]]]:
    """(arm label, [(seed, type -> milestone)]) at the largest budget, the SAN first."""
    ref = rec.tables["gaps"][0]["reference"] if rec.tables["gaps"] else "san"
    out = []
    for role, label in [("reference", ref)] + [(g["role"], arm_label(g)) for g in rec.gaps_at(rec.largest)]:
        per = []
        for i, rid in enumerate(_run_ids_at(rec, role, rec.largest)):
            c = crystallisation_of(rec, rid)
            if c is not None:
                per.append((int(rid.rsplit("-s", 1)[1]) if "-s" in rid else i, c))
        if per:
            out.append((label, per))
    return out


def block_crystallisation(rec: Record) -> str:
    runs = _crys_runs(rec)
    if not runs:
        return "No weight spectra in the analysis (milestone checkpoints were not kept or not analysed)."

    def cell(per: list[tuple[int, dict[str, float | None]]], t: str) -> str:
        vals = [c.get(t, "absent") for _, c in per]
        if all(v == "absent" for v in vals):
            return "–"
        return ", ".join("never" if v is None else ("–" if v == "absent" else f"{100 * float(v):g}%")
                         for v in vals)

    rows = [[label, ", ".join(f"s{s}" for s, _ in per)] + [cell(per, t) for t in MATRIX_TYPES]
            for label, per in runs]
    head = (f"At {fmt_tokens(rec.largest or 0)}: the milestone (share of training) after which each matrix "
            "type's singular-value spectrum stopped changing (`sanlab analyze`), per seed; never: it had not "
            "settled by the end. Paper: Q, K settle within the first quarter; V, O, FFN down keep changing.")
    return "\n\n".join([head, md_table(["arm", "seeds"] + list(MATRIX_TYPES), rows)])


# --------------------------------------------------------------------------- claims


@dataclass
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str


def _claims_arm(rec: Record) -> dict[str, Any] | None:
    """The gap the localisation claims are read on: iso-param (the paper's), else the first arm."""
    gaps = rec.gaps_at(rec.largest)
    return rec.gap("iso-param", rec.largest) or (gaps[0] if gaps else None)


def _mean(g: dict[str, Any] | None) -> float | None:
    return g.get("mean") if g and _finite(g.get("mean")) else None


def claims(rec: Record, compare: Record | None = None) -> list[Claim]:
    """One row per SPEC §1.6 claim, each with its verdict by the rules of this module's docstring."""
    out = []
    big = rec.largest
    t = noise_threshold(rec, big)
    tt = f"T = {fmt(t, '{:.4f}')}"
    dp, df, dd = (_mean(rec.gap(r, big)) for r in ("iso-param", "iso-FLOP", "iso-depth"))
    out.append(Claim("ordering of the gaps: iso-depth > iso-FLOP > iso-param",
                     "Δ iso-depth −0.470, iso-FLOP −0.263, iso-param −0.0055 (105B)",
                     f"at {fmt_tokens(big or 0)}: iso-depth {fmt(dd)}, iso-FLOP {fmt(df)}, iso-param {fmt(dp)}; {tt}",
                     verdict_ordering(dp, df, dd, t)))

    series = [(tok, m) for tok in rec.budgets if (m := _mean(rec.gap("iso-param", tok))) is not None]
    out.append(Claim("the iso-param gap shrinks with tokens",
                     "Δ iso-param −0.046 (5B), −0.019 (30B), −0.0055 (105B)",
                     ", ".join(f"{fmt(m)} ({fmt_tokens(tok)})" for tok, m in series) + f"; {tt}"
                     + ("; needs ≥ 2 final budgets" if len(series) < 2 else "") if series else "–",
                     verdict_shrinking(series, t)))

    g = _claims_arm(rec)
    deltas = region_deltas(rec, g) if g else {}
    q, tr, agg = deltas.get("query", []), deltas.get("trace", []), deltas.get("aggregate", [])
    n = min(len(q), len(tr), len(agg))
    qt = [a - b for a, b in zip(q[:n], tr[:n])]
    qa = [a - b for a, b in zip(q[:n], agg[:n])]
    measured = (f"{arm_label(g)}: query {fmt_ms(q)}, trace {fmt_ms(tr)}, aggregate {fmt_ms(agg)}; "
                f"query − trace {fmt_ms(qt)}, query − aggregate {fmt_ms(qa)}") if g and q else (
                    "no query tokens in this corpus" if g and agg else "no analysed pairs")
    out.append(Claim("the SAN's deficit is concentrated on query tokens",
                     "Δ query −0.052 vs trace −0.008 (31B); query −0.038 at 105B", measured,
                     verdict_query(qt, qa)))

    per_type: dict[str, list[float]] = {}
    share: dict[str, float] = {}
    if g:
        per_type, share = exercise_deltas(rec, g)
    recall = set(recall_types())
    if not has_types(per_type):
        out.append(Claim("recall types favour the standard arm, context-grounded types the SAN",
                         "recall-heavy types favour FFN; rag, editing, math favour the SAN",
                         "no exercise types in this corpus" if g and rec.pairs(g) else "no analysed pairs",
                         INCONCLUSIVE))
    else:
        r_s, c_s = [], []
        for _, c in rec.pairs(g).items():
            rows = _rows(c, "exercise")

            def wmean(names: set[str]) -> float | None:
                sel = [r for k, r in rows.items() if k in names and _finite(r.get("delta"))]
                w = sum(r["tokens"] for r in sel)
                return sum(r["delta"] * r["tokens"] for r in sel) / w if w else None

            r, cc = wmean(recall), wmean(set(rows) - recall)
            if r is not None and cc is not None:
                r_s.append(r)
                c_s.append(cc)
        out.append(Claim("recall types favour the standard arm, context-grounded types the SAN",
                         "recall-heavy types favour FFN (Δ < 0); rag, editing, math favour the SAN (Δ > 0)",
                         f"{arm_label(g)}: recall {fmt_ms(r_s)}, context-grounded {fmt_ms(c_s)} (token-weighted)",
                         verdict_exercise(r_s, c_s)))

    errs = [float(i["rel_error"]) for *_, i in identity_rows(rec) if _finite(i.get("rel_error"))]
    out.append(Claim("token-weighted region Δs reproduce the aggregate Δ", "within 2%",
                     f"largest relative error {100 * max(errs):.4f}% over {len(errs)} analysed pair(s)" if errs
                     else "no analysed pairs", verdict_identity(errs)))

    crys = _crys_runs(rec)
    decisions = [settles_before(c) for _, per in crys for _, c in per]
    yes = sum(1 for d in decisions if d)
    no = sum(1 for d in decisions if d is False)
    out.append(Claim("Q/K crystallise before V/O/FFN-down", "Q, K settle within the first quarter; V, O, down keep "
                     "changing", f"{yes} run(s) before, {no} not, {len(decisions) - yes - no} undecided "
                     f"(at {fmt_tokens(big or 0)})" if decisions else "no weight spectra",
                     verdict_crystallisation(decisions)))

    other = rec.config.get("compare_with")
    if other:
        paper = "web text: gap predicted 0.02–0.05, measured 0.040 (pre-registered)"
        if compare is None:
            out.append(Claim(f"the real-text gap is larger than the embedded corpus's ({other})", paper,
                             f"record {other} not found", INCONCLUSIVE))
        else:
            here, there = dp, _mean(compare.gap("iso-param", compare.largest))
            t2 = None if t is None or noise_threshold(compare, compare.largest) is None else \
                max(t, noise_threshold(compare, compare.largest) or 0.0)
            out.append(Claim(f"the real-text gap is larger than the embedded corpus's ({other})", paper,
                             f"|Δ iso-param| here {fmt(None if here is None else abs(here), '{:.4f}')} "
                             f"({fmt_tokens(big or 0)}) vs {other} "
                             f"{fmt(None if there is None else abs(there), '{:.4f}')} "
                             f"({fmt_tokens(compare.largest or 0)}); T = {fmt(t2, '{:.4f}')}",
                             verdict_compare(here, there, t2)))
    return out


def load_compare(rec: Record) -> Record | None:
    name = rec.config.get("compare_with")
    if not name:
        return None
    path = rec.dir.parent / name
    if not (path / STUDY / "study.json").is_file():
        return None
    return load(path)


def block_claims(rec: Record) -> str:
    rows = [[c.claim, c.paper, c.measured, f"**{c.verdict}**"] for c in claims(rec, load_compare(rec))]
    out = [f"{SIGN_NOTE}", md_table(["claim", "paper (our sign)", "measured", "verdict"], rows)]
    if rec.config.get("prediction"):
        out.append(f"Prediction written before the run: {rec.config['prediction']}")
    keys = ["ordering", "shrinking", "query", "exercise", "identity", "crystallisation"]
    if rec.config.get("compare_with"):
        keys.append("compare")
    out.append("Verdict rules (`scripts/records.py`): " + RULES_PREAMBLE + "\n\n"
               + "\n".join(f"- {RULES[k]}" for k in keys))
    return "\n\n".join(out)


BLOCKS: dict[str, Callable[[Record], str]] = {
    "gaps": block_gaps,
    "floor": block_floor,
    "regions": block_regions,
    "exercises": block_exercises,
    "identity": block_identity,
    "crystallisation": block_crystallisation,
    "claims": block_claims,
}


# --------------------------------------------------------------------------- the README


MARKER = re.compile(r"<!-- records:BEGIN (\S+) -->\n(.*?)<!-- records:END \1 -->", re.S)


def skeleton(rec: Record) -> str:
    """A new README: a title, where the numbers come from, and every block's markers."""
    name = rec.dir.name
    parts = [f"# Record {name}\n", "The tables between the `records:` markers are generated from `study/` by "
             f"`python scripts/records.py readme records/{name}`; `make records-check` checks them.\n"]
    for b in BLOCKS:
        parts.append(f"## {b}\n\n<!-- records:BEGIN {b} -->\n<!-- records:END {b} -->\n")
    return "\n".join(parts)


def render(text: str, rec: Record) -> tuple[str, list[str]]:
    """(the README with every block replaced, names of the blocks whose text changed)."""
    seen = [m.group(1) for m in MARKER.finditer(text)]
    unknown = [n for n in seen if n not in BLOCKS]
    if unknown:
        raise RecordError(f"README block {unknown[0]!r} is not one of: {', '.join(BLOCKS)}")
    if not seen:
        raise RecordError(f"{rec.dir / README}: no `<!-- records:BEGIN NAME -->` blocks")
    changed: list[str] = []

    def sub(m: re.Match[str]) -> str:
        new = BLOCKS[m.group(1)](rec).rstrip("\n") + "\n"
        if m.group(2) != new:
            changed.append(m.group(1))
        return f"<!-- records:BEGIN {m.group(1)} -->\n{new}<!-- records:END {m.group(1)} -->"

    return MARKER.sub(sub, text), changed


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
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise RecordError(f"{path}: not readable ({e})") from None
    new, changed = render(text, rec)
    if check:
        for name in changed:
            log(f"{path}: block {name!r} differs from what the committed results give")
        if changed:
            log(f"regenerate with: python scripts/records.py readme {record_dir}")
        return 1 if changed else 0
    if new != text:
        _write_text(path, new)
    log(f"{path}: {len(changed)} block(s) updated" + (f" ({', '.join(changed)})" if changed else ""))
    return 0


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="records.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="copy a finished study dir into a record (no checkpoints, no shards)")
    e.add_argument("study_dir", type=Path)
    e.add_argument("record_dir", type=Path)
    r = sub.add_parser("readme", help="rewrite (or --check) the README's generated blocks")
    r.add_argument("record_dir", type=Path)
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block is stale")
    args = p.parse_args(argv)
    try:
        if args.cmd == "export":
            export(args.study_dir, args.record_dir)
            return 0
        return readme(args.record_dir, check=args.check)
    except SanlabError as err:
        print(f"sanlab: error: {' '.join(str(err).splitlines())}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
