"""A record dir read into plain data: its study's tables (as `sanlab study table --json`
gives them), the analysis of its final pairs, its entropy floor and `record.toml`."""

from __future__ import annotations

import json
import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from sanlab.errors import SanlabError
from sanlab.records.common import (
    CONFIG,
    CONFIG_KEYS,
    REGIONS,
    STUDY,
    RecordError,
    arm_label,
    finite,
    fmt_tokens,
    read_json,
    rows_of,
)

# --------------------------------------------------------------------------- loading


def study_tables(study_dir: Path) -> dict[str, Any]:
    """What `sanlab study table DIR --json` prints (computed in this process)."""
    from sanlab.study.results import table_json

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
        raise RecordError(f"{d}: not a record (no {STUDY}/study.json); run `sanlab record export` first")
    spec = read_json(study / "study.json")
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
        a = read_json(path)
        if not isinstance(a, dict) or not isinstance(a.get("runs"), dict):
            raise RecordError(f"{path}: not an analysis file")
        analyses.append(a)
    floor = None
    if (study / "data" / "entropy_floor.json").is_file():
        floor = read_json(study / "data" / "entropy_floor.json")
        if not isinstance(floor, dict) or "splits" not in floor:
            raise RecordError(f"{study / 'data' / 'entropy_floor.json'}: not an entropy-floor file")
    return Record(d, spec, tables, analyses, floor, load_config(d))


def noise_pair(rec: Record, tokens: int | None) -> dict[str, Any] | None:
    pairs = [n for n in rec.tables.get("noise_floor", []) if n.get("per_seed")]
    if not pairs or tokens is None:
        return None
    return min(pairs, key=lambda n: (abs(math.log(n["tokens"] / tokens)), n["tokens"]))


def run_ids_at(rec: Record, role: str, tokens: int | None) -> list[str]:
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
        rows = rows_of(c, "region")
        for region in REGIONS:
            if region in rows and finite(rows[region].get("delta")):
                out.setdefault(region, []).append(float(rows[region]["delta"]))
        agg = ((c.get("region") or {}).get("identity") or {}).get("aggregate_delta")
        if finite(agg):
            out.setdefault("aggregate", []).append(float(agg))
    return out


def exercise_deltas(rec: Record, g: dict[str, Any]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(exercise type -> Δ per analysed seed pair, type -> token share (mean))."""
    out: dict[str, list[float]] = {}
    share: dict[str, list[float]] = {}
    for _, c in rec.pairs(g).items():
        for name, r in rows_of(c, "exercise").items():
            if finite(r.get("delta")):
                out.setdefault(name, []).append(float(r["delta"]))
                share.setdefault(name, []).append(float(r["token_share"]))
    return out, {k: statistics.fmean(v) for k, v in share.items()}


def has_types(types: Iterable[str]) -> bool:
    """A corpus has exercise types when its documents fall into more than one."""
    return len(set(types)) > 1


def recall_types() -> tuple[str, ...]:
    from sanlab.data.synth import RECALL_TYPES

    return RECALL_TYPES


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


def crystallisation_of(rec: Record, run_id: str) -> dict[str, float | None] | None:
    sp = (rec.runs().get(run_id) or {}).get("spectra")
    if not sp or not sp.get("crystallisation"):
        return None
    return {c["type"]: c["milestone"] for c in sp["crystallisation"]}


def crystallisation_runs(rec: Record) -> list[tuple[str, list[tuple[int, dict[str, float | None]]]]]:
    """(arm label, [(seed, type -> milestone)]) at the largest budget, the SAN first."""
    ref = rec.tables["gaps"][0]["reference"] if rec.tables["gaps"] else "san"
    out = []
    for role, label in [("reference", ref)] + [(g["role"], arm_label(g)) for g in rec.gaps_at(rec.largest)]:
        per = []
        for i, rid in enumerate(run_ids_at(rec, role, rec.largest)):
            c = crystallisation_of(rec, rid)
            if c is not None:
                per.append((int(rid.rsplit("-s", 1)[1]) if "-s" in rid else i, c))
        if per:
            out.append((label, per))
    return out

