"""A study record (kinds `matched` and `variants`) read into plain data: its study's tables
as the study computes them (`sanlab.study.results.table_json`, what `sanlab study table
--json` prints), the analysis of its final pairs, its entropy floor and `record.toml`.

Nothing here recomputes a gap or a noise verdict; the record's claims read the study's
per-seed numbers against the study's noise rule (`sanlab.study.noise`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from sanlab.data.synth import RECALL_TYPES
from sanlab.errors import SanlabError
from sanlab.fileio import read_toml
from sanlab.records.common import (
    CONFIG,
    CONFIG_KEYS,
    PAPER_GAP_TEXT,
    REGIONS,
    SIGN_NOTE,
    STUDY,
    RecordError,
    arm_label,
    finite,
    fmt,
    fmt_floor,
    fmt_ms,
    fmt_tokens,
    md_table,
    paired,
    per_seed,
    per_seed_text,
    per_seed_values,
    read_json,
    rows_of,
)
from sanlab.study import noise
from sanlab.study.results import table_json
from sanlab.study.store import ResultStore


def damaged_lines(study_dir: Path) -> list[int]:
    """Line numbers of the study's results store that are not records (torn, not UTF-8 JSON,
    not an object, fields of the wrong type): `sanlab.study.store.ResultStore.damaged`."""
    return ResultStore(study_dir).damaged()


def damaged_text(bad: list[int]) -> str:
    return f"line {bad[0]} is" if len(bad) == 1 else f"lines {', '.join(map(str, bad[:5]))}{' …' if len(bad) > 5 else ''} are"


def study_tables(study_dir: Path) -> dict[str, Any]:
    """What `sanlab study table DIR --json` prints (computed in this process)."""
    return json.loads(json.dumps(table_json(study_dir)))  # exactly the printed JSON's types


@dataclass
class StudyRecord:
    """A record dir's study as plain data."""

    dir: Path
    spec: dict[str, Any]
    tables: dict[str, Any]
    analyses: list[dict[str, Any]]  # path order; a later file wins for the same pair
    floor: dict[str, Any] | None
    config: dict[str, Any] = field(default_factory=dict)
    kind: str = "matched"

    @property
    def study(self) -> Path:
        return self.dir / STUDY

    @property
    def optimizer(self) -> str:
        return str(self.spec.get("optimizers", ["muon"])[0])

    @property
    def reference(self) -> str:
        return str(self.tables["arms"][0]["name"]) if self.tables.get("arms") else "san"

    @property
    def budgets(self) -> list[int]:
        return sorted({int(g["tokens"]) for g in self.tables["gaps"] if g["optimizer"] == self.optimizer})

    @property
    def largest(self) -> int | None:
        return self.budgets[-1] if self.budgets else None

    @property
    def noise(self) -> dict[str, Any] | None:
        """The noise-floor pair (the study runs one, at one budget), once it has a seed."""
        return next((n for n in self.tables.get("noise_floor", []) if n.get("per_seed")), None)

    @property
    def floor_size(self) -> float | None:
        """F of the noise rule, as the study computed it (`sanlab.study.noise.floor_size`)."""
        n = self.noise
        return None if n is None else n.get("size")

    def arm(self, name: str) -> dict[str, Any] | None:
        return next((a for a in self.tables.get("arms", []) if a["name"] == name), None)

    def gaps_at(self, tokens: int | None) -> list[dict[str, Any]]:
        return [g for g in self.tables["gaps"] if g["optimizer"] == self.optimizer and g["tokens"] == tokens]

    def gap(self, role: str, tokens: int | None) -> dict[str, Any] | None:
        return next((g for g in self.gaps_at(tokens) if g["role"] == role), None)

    def gap_of(self, arm: str, tokens: int | None) -> dict[str, Any] | None:
        return next((g for g in self.gaps_at(tokens) if g["arm"] == arm), None)

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
    cfg = read_toml(path, RecordError)
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise RecordError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(CONFIG_KEYS))})")
    for k, v in cfg.items():
        if not isinstance(v, str) or not v.strip():
            raise RecordError(f"{path}: {k} must be a non-empty string")
    return cfg


def load_study(record_dir: Path, kind: str) -> StudyRecord:
    """Read a study record's `study/`; `RecordError` (one line) when it is missing or corrupt."""
    d = Path(record_dir)
    study = d / STUDY
    if not (study / "study.json").is_file():
        raise RecordError(f"{d}: a {kind} record without {STUDY}/study.json")
    spec = read_json(study / "study.json")
    if not isinstance(spec, dict):
        raise RecordError(f"{study / 'study.json'}: not a study spec")
    if not (study / "results.jsonl").is_file():
        raise RecordError(f"{study}: no results store (results.jsonl)")
    bad = damaged_lines(study)
    if bad:  # the tables would be computed without them: a wrong README, never a regenerated one
        raise RecordError(f"{study / 'results.jsonl'}: the record's results are damaged ({damaged_text(bad)} not a "
                          "JSON record of the store's fields); restore the file (e.g. from git), nothing was changed")
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
    return StudyRecord(d, spec, tables, analyses, floor, load_config(d), kind)


def run_ids_at(rec: StudyRecord, role: str, tokens: int | None, arm: str | None = None) -> list[str]:
    """The final run ids of an arm (by role, or by name where several arms share a role;
    or of the reference) at a budget, by seed."""
    ids: dict[str, str] = {}
    for g in rec.gaps_at(tokens):
        if role == "reference" or (g["arm"] == arm if arm is not None else g["role"] == role):
            for seed, pair in (g.get("runs") or {}).items():
                ids[seed] = pair["reference" if role == "reference" else "arm"]
    return [ids[s] for s in sorted(ids, key=int)]


def region_deltas(rec: StudyRecord, g: dict[str, Any]) -> dict[str, dict[int, float]]:
    """Region -> seed -> Δ of each analysed seed pair; plus "aggregate"."""
    out: dict[str, dict[int, float]] = {}
    for seed, c in rec.pairs(g).items():
        rows = rows_of(c, "region")
        for region in REGIONS:
            if region in rows and finite(rows[region].get("delta")):
                out.setdefault(region, {})[seed] = float(rows[region]["delta"])
        agg = ((c.get("region") or {}).get("identity") or {}).get("aggregate_delta")
        if finite(agg):
            out.setdefault("aggregate", {})[seed] = float(agg)
    return out


def exercise_deltas(rec: StudyRecord, g: dict[str, Any]) -> tuple[dict[str, list[float]], dict[str, float]]:
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
    return RECALL_TYPES  # the generator's, where the types are defined


def identity_rows(rec: StudyRecord) -> list[tuple[str, int, str, dict[str, Any]]]:
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


def crystallisation_of(rec: StudyRecord, run_id: str) -> dict[str, float | None] | None:
    sp = (rec.runs().get(run_id) or {}).get("spectra")
    if not sp or not sp.get("crystallisation"):
        return None
    return {c["type"]: c["milestone"] for c in sp["crystallisation"]}


def crystallisation_runs(rec: StudyRecord) -> list[tuple[str, list[tuple[int, dict[str, float | None]]]]]:
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


# --------------------------------------------------------------------------- blocks every study record has


def losses_at(rec: StudyRecord, role: str, tokens: int | None, arm: str | None = None) -> dict[int, float]:
    """Seed -> final val loss of an arm (by role, or by name where several arms share a
    role; "reference" for the reference) at a budget."""
    if role == "reference":
        out: dict[int, float] = {}
        for g in rec.gaps_at(tokens):
            out.update({s: v for s, v in per_seed(g, "reference_per_seed").items() if s not in out})
        return out
    return per_seed(rec.gap_of(arm, tokens) if arm is not None else rec.gap(role, tokens), "arm_per_seed")


def block_gaps(rec: StudyRecord, sign_note: str = SIGN_NOTE,
               paper: Callable[[dict[str, Any]], str] = lambda g: PAPER_GAP_TEXT.get(g["role"], "–"),
               paper_header: str = "paper (105B unless noted)") -> str:
    """Per final budget × arm: losses, Δ per seed, mean ± sd, the noise pair, the verdict, the paper."""
    ref = rec.tables["gaps"][0]["reference"] if rec.tables["gaps"] else rec.reference
    rows = []
    opts = [str(o) for o in rec.spec.get("optimizers", [rec.optimizer])]

    def order(g: dict[str, Any]) -> tuple[int, int]:
        return (opts.index(g["optimizer"]) if g["optimizer"] in opts else len(opts), int(g["tokens"]))

    noise = rec.noise
    for g in sorted(rec.tables["gaps"], key=order):
        tokens = int(g["tokens"])
        at = "" if noise is None or noise["tokens"] == tokens else f" (at {fmt_tokens(noise['tokens'])})"
        rows.append([fmt_tokens(tokens), arm_label(g), g["label"], g["optimizer"],
                     fmt(g.get("reference_loss"), "{:.4f}"), fmt(g.get("arm_loss"), "{:.4f}"), per_seed_text(g),
                     fmt_ms(per_seed_values(g)), per_seed_text(noise) + at, g.get("verdict", "–"), paper(g)])
    if not rows:
        return "No final gaps in the results store yet."
    head = [f"{sign_note} Noise pair: {ref} with its norm swapped, same seeds. The other blocks and the "
            f"claims read the first optimizer ({rec.optimizer})."]
    return "\n\n".join(head + [md_table(
        ["budget", "arm", "config", "optimizer", f"{ref} loss", "arm loss", "Δ per seed", "Δ mean ± sd",
         "noise-pair Δ per seed", "verdict (study table)", paper_header], rows)])


def _val_floor(rec: StudyRecord) -> float | None:
    if rec.floor is None:
        return None
    v = ((rec.floor.get("splits") or {}).get("val") or {}).get("nats_per_token")
    return float(v) if finite(v) else None


def _mean_loss(rec: StudyRecord, role: str, tokens: int, arm: str | None = None) -> float | None:
    if role == "reference":
        vals = [g.get("reference_loss") for g in rec.gaps_at(tokens)]
        vals = [v for v in vals if finite(v)]
        return vals[0] if vals else None
    g = rec.gap_of(arm, tokens) if arm is not None else rec.gap(role, tokens)
    return g.get("arm_loss") if g else None


def still_falling(rec: StudyRecord, role: str, tokens: int, prev: int, arm: str | None = None) -> str:
    """"yes" when the arm's loss dropped from budget `prev` to `tokens` beyond noise (per
    seed, `sanlab.study.noise`), "no" when not, "–" without a noise pair or paired seeds."""
    a, b = losses_at(rec, role, prev, arm), losses_at(rec, role, tokens, arm)
    seeds = paired(a, b)
    if rec.floor_size is None or not seeds:
        return "–"
    return "yes" if noise.sign([b[s] - a[s] for s in seeds], rec.floor_size) == -1 else "no"


def block_floor(rec: StudyRecord) -> str:
    """Per arm at each budget: loss, the corpus's entropy floor, loss above it, change with budget."""
    floor = _val_floor(rec)
    if not rec.budgets:
        return "No final runs yet."
    ref = rec.tables["gaps"][0]["reference"]
    # Each arm by its name: several arms can share a role (a variants study's are all "explicit").
    arms = [("reference", ref, None)] + [(g["role"], arm_label(g), g["arm"]) for g in rec.gaps_at(rec.largest)]
    rows, summary = [], []
    for role, label, name in arms:
        prev, prev_tokens = None, None
        for tokens in rec.budgets:
            loss = _mean_loss(rec, role, tokens, name)
            change = None if loss is None or prev is None else loss - prev
            falling = ("–" if change is None or prev_tokens is None
                       else still_falling(rec, role, tokens, prev_tokens, name))
            rows.append([label, fmt_tokens(tokens), fmt(loss, "{:.4f}"), fmt(floor, "{:.4f}"),
                         fmt(None if loss is None or floor is None else loss - floor, "{:.4f}"),
                         fmt(change), falling])
            if loss is not None:
                prev, prev_tokens = loss, tokens
        above = losses_at(rec, role, rec.largest, name)
        sign = (None if floor is None or not above or rec.floor_size is None
                else noise.sign([v - floor for v in above.values()], rec.floor_size))
        summary.append((label, sign, rows[-1][6]))
    F = fmt_floor(rec.floor_size)
    if floor is None:
        head = "This corpus has no entropy floor (data/entropy_floor.json is absent): loss above floor is not defined."
    else:
        head = (f"Entropy floor of the validation split: {floor:.4f} nats/token (data/entropy_floor.json; a lower "
                "bound on any model's mean loss). Still falling: the loss dropped since the previous budget by "
                f"more than the noise (`sanlab.study.noise`: F + the seed-to-seed sd of the drop; F = {F}).")
    out = [head, md_table(["arm", "budget", "val loss (mean over seeds)", "entropy floor", "above floor",
                           "change vs previous budget", "still falling"], rows)]
    if floor is not None:
        if any(s[1] is None for s in summary):
            above_all = "– (not every arm has a loss, or there is no noise pair)"
        else:
            above_all = "yes" if all(s[1] == 1 for s in summary) else "no"
        still = [s[0] for s in summary if s[2] == "yes"]
        unmeasured = [s[0] for s in summary if s[2] == "–"]
        falling = ("not measured (one final budget)" if len(rec.budgets) < 2
                   else (", ".join(still) if still else "none")
                   + (f" (not measured: {', '.join(unmeasured)})" if unmeasured else ""))
        out.append(f"At the largest budget ({fmt_tokens(rec.largest or 0)}): every arm above the floor by more "
                   f"than the noise: {above_all}; still falling: {falling}.")
    # The analysis's own per-region floor on the analysed sample.
    runs = rec.runs()
    reg_rows = []
    for role, label, name in arms:
        ids = run_ids_at(rec, role, rec.largest, name)
        for region in REGIONS:
            vals = [r for rid in ids if rid in runs
                    for r in ((runs[rid].get("losses") or {}).get("region") or []) if r["group"] == region]
            if not vals or not any(finite(v.get("entropy_floor")) for v in vals):
                continue
            reg_rows.append([label, region, fmt(statistics.fmean(v["loss"] for v in vals), "{:.4f}"),
                             fmt(statistics.fmean(v["entropy_floor"] for v in vals), "{:.4f}"),
                             fmt(statistics.fmean(v["loss_above_floor"] for v in vals), "{:.4f}")])
    if reg_rows:
        out.append(f"Per region at {fmt_tokens(rec.largest or 0)}, on the analysed validation sample "
                   "(`sanlab analyze`; mean over seeds):")
        out.append(md_table(["arm", "region", "loss", "entropy floor", "above floor"], reg_rows))
    return "\n\n".join(out)
