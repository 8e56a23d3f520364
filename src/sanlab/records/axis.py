"""Kind `axis`: a SAN against its matched partners over a data axis (`data.axis`), e.g.
the planted world's size: where the SAN's deficit lives as the facts a model must store
grow (SPEC §1.6's localisation, read as a curve).

Each value of the axis is a study of its own inside the one study dir (its own gaps,
noise pair and analysed pairs; the LRs its own sweep's, or `sweep.lock_at`'s), read here
through `AxisRecord.at(slug)`, a `StudyRecord` holding that value's rows only, so the
`matched` kind's blocks render each value as they render a whole matched record. The
blocks of this kind add the axis: the world's facts and bits per parameter, Δ by region
and by exercise kind against facts per parameter, the loss above the floor, zero-shot
QA, and the claims, each read against the noise rule (`sanlab.study.noise`): per seed
pair, a quantity counts as above / below 0 when |mean| > F + its seed-to-seed sd; a
difference between two values of the axis has F of both values added in quadrature.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from sanlab.analysis.kinds import kind_deltas, kind_losses, recall_types
from sanlab.analysis.output import load_milestone_analyses
from sanlab.records import matched
from sanlab.records.common import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REGIONS,
    REPRODUCED,
    SIGN_NOTE,
    Claim,
    ClaimSet,
    RecordError,
    arm_label,
    finite,
    fmt,
    fmt_ms,
    fmt_tokens,
    md_table,
    paired,
    read_json,
)
from sanlab.records.study import StudyRecord, block_floor, block_gaps, load_study, region_deltas, run_ids_at
from sanlab.study import noise

ZERO_SHOT = {"grounded": "sanlab_grounded_qa", "closed-book": "sanlab_closed_book_qa",
             "unseen": "sanlab_closed_book_unseen"}
AIM = 0.1  # nats: the smallest world's context-grounded loss should come within this of its floor

RULES_PREAMBLE = matched.RULES_PREAMBLE + (" Between two values of the data axis (two worlds trained apart, on the "
                                           "same seeds), F is both values' F added in quadrature.")


@dataclass
class AxisRecord:
    """A record of a study with a data axis: the whole study, and one view per value."""

    rec: StudyRecord
    key: str
    points: list[dict[str, Any]]  # the study table's data points: slug, value, label, info
    views: dict[str, StudyRecord] = field(default_factory=dict)
    milestones: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # percent -> analyses

    @property
    def dir(self) -> Path:
        return self.rec.dir

    @property
    def slugs(self) -> list[str]:
        return [p["slug"] for p in self.points]

    def at(self, slug: str) -> StudyRecord:
        return self.views[slug]

    def value(self, slug: str) -> Any:
        return next(p["value"] for p in self.points if p["slug"] == slug)

    def label(self, slug: str) -> str:
        return f"{self.key}={self.value(slug)}"

    def per_arm(self, slug: str, arm: str) -> dict[str, Any]:
        rows = (self.rec.tables.get("data") or {}).get("per_arm") or []
        return next((r for r in rows if r["data"] == slug and r["arm"] == arm), {})

    def x(self, slug: str) -> float | None:
        """Facts per non-embedding parameter of the reference (the curve's x)."""
        v = self.per_arm(slug, self.rec.reference).get("facts_per_param")
        return float(v) if finite(v) else None

    def claims_gap(self, slug: str) -> dict[str, Any] | None:
        return matched.claims_arm(self.at(slug))


def _view(rec: StudyRecord, slug: str) -> StudyRecord:
    t = rec.tables
    tables = {**t, "gaps": [g for g in t["gaps"] if (g.get("data") or "") == slug],
              "noise_floor": [n for n in t.get("noise_floor", []) if (n.get("data") or "") == slug]}
    floor_file = rec.study / "data" / slug / "entropy_floor.json"
    floor = read_json(floor_file) if floor_file.is_file() else None
    return replace(rec, tables=tables, floor=floor)


def load_axis(record_dir: Path) -> AxisRecord:
    rec = load_study(record_dir, "axis")
    data = rec.tables.get("data") or {}
    points = [p for p in data.get("points") or [] if p.get("slug")]
    out = AxisRecord(rec, str(data.get("key") or ""), points)
    out.views = {p["slug"]: _view(rec, p["slug"]) for p in points}
    out.milestones = milestone_analyses(rec.study)
    return out


def milestone_analyses(study: Path) -> dict[int, list[dict[str, Any]]]:
    """Percent -> the losses-only analyses of the final pairs at that milestone checkpoint
    (`sanlab report --analyze --milestones`), every group's together (they are keyed by run)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for by_pct in load_milestone_analyses(study / "analysis", RecordError).values():
        for pct, a in by_pct.items():
            out.setdefault(pct, []).append(a)
    return out


# --------------------------------------------------------------------------- per value, per seed pair


def kind_series(ax: AxisRecord, slug: str) -> dict[str, dict[int, float]]:
    """Seed -> Δ of the claims arm's analysed pairs at one value: recall, context, each
    region, aggregate, and query − aggregate."""
    view = ax.at(slug)
    g = ax.claims_gap(slug)
    if g is None:
        return {}
    out: dict[str, dict[int, float]] = {"recall": {}, "context": {}}
    for seed, c in view.pairs(g).items():
        r, cc = kind_deltas(c)
        if r is not None:
            out["recall"][seed] = r
        if cc is not None:
            out["context"][seed] = cc
    out.update(region_deltas(view, g))
    q, agg = out.get("query", {}), out.get("aggregate", {})
    out["query_minus_aggregate"] = {s: q[s] - agg[s] for s in paired(q, agg)}
    out["query_share"] = {}
    for seed, c in view.pairs(g).items():
        rows = {r["group"]: r for r in (c.get("region") or {}).get("rows") or []}
        a = ((c.get("region") or {}).get("identity") or {}).get("aggregate_delta")
        if "query" in rows and finite(a) and a:
            out["query_share"][seed] = rows["query"]["weighted"] / a
    return out


def _across(ax: AxisRecord, what: str) -> tuple[list[float], float | None, str, str] | None:
    """Per seed pair, `what` at the largest world minus at the smallest (the axis's last and
    first values), F of both in quadrature, and the two ends' labels."""
    if len(ax.slugs) < 2:
        return None
    lo, hi = ax.slugs[0], ax.slugs[-1]
    a, b = kind_series(ax, lo).get(what, {}), kind_series(ax, hi).get(what, {})
    seeds = paired(a, b)
    fa, fb = ax.at(lo).floor_size, ax.at(hi).floor_size
    floor = None if fa is None or fb is None else math.hypot(fa, fb)
    if not seeds:
        return None
    return [b[s] - a[s] for s in seeds], floor, ax.label(lo), ax.label(hi)


def _sign_verdict(values: list[float], floor: float | None, want: int) -> str:
    s = noise.sign(values, floor)
    if s == want:
        return REPRODUCED
    if s == -want:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _series_text(ax: AxisRecord, what: str, f: str = "{:+.4f}") -> str:
    parts = []
    for slug in ax.slugs:
        v = list(kind_series(ax, slug).get(what, {}).values())
        if v:
            parts.append(f"{fmt_ms(v, f)} ({ax.value(slug)})")
    return ", ".join(parts) or "no analysed pairs"


# --------------------------------------------------------------------------- zero-shot


def eval_results(view: StudyRecord, run_id: str) -> dict[str, Any] | None:
    path = view.study / "runs" / run_id / "eval" / "results-latest.json"
    if not path.is_file():
        return None
    r = read_json(path)
    return r if isinstance(r, dict) else None


def accuracy(res: dict[str, Any] | None, task: str) -> tuple[float, float] | None:
    m = (((res or {}).get("tasks") or {}).get(task) or {}).get("metrics") or {}
    if finite(m.get("acc")) and finite(m.get("acc_stderr")):
        return float(m["acc"]), float(m["acc_stderr"])
    return None


def zero_shot(ax: AxisRecord, slug: str) -> dict[str, dict[str, Any]]:
    """kind -> {"san": [acc per seed], "arm": [...], "delta": {seed: Δacc}, "se": {seed: stderr of Δ}}
    of the claims arm's final pairs at one value (the seeds both runs were evaluated on)."""
    view = ax.at(slug)
    g = ax.claims_gap(slug)
    out: dict[str, dict[str, Any]] = {}
    if g is None:
        return out
    for kind, task in ZERO_SHOT.items():
        row: dict[str, Any] = {"san": {}, "arm": {}, "delta": {}, "se": {}}
        for seed, ids in (g.get("runs") or {}).items():
            a = accuracy(eval_results(view, ids["arm"]), task)
            r = accuracy(eval_results(view, ids["reference"]), task)
            if a is None or r is None:
                continue
            s = int(seed)
            row["arm"][s], row["san"][s] = a[0], r[0]
            row["delta"][s], row["se"][s] = a[0] - r[0], math.hypot(a[1], r[1])
        out[kind] = row
    return out


def _pooled(ax: AxisRecord, kind: str) -> tuple[float, float, int] | None:
    d, se = [], []
    for slug in ax.slugs:
        row = zero_shot(ax, slug).get(kind) or {}
        d += list(row.get("delta", {}).values())
        se += list(row.get("se", {}).values())
    if not d:
        return None
    return statistics.fmean(d), math.sqrt(sum(x * x for x in se)) / len(se), len(d)


def verdict_zero_shot(closed: tuple[float, float, int] | None, grounded: tuple[float, float, int] | None) -> str:
    if closed is None or grounded is None:
        return INCONCLUSIVE
    cb = 1 if closed[0] > 2 * closed[1] else (-1 if closed[0] < -2 * closed[1] else 0)
    gr = 1 if grounded[0] > 2 * grounded[1] else (-1 if grounded[0] < -2 * grounded[1] else 0)
    if cb == 1 and gr != 1:
        return REPRODUCED
    if cb == -1 or gr == 1:
        return NOT_REPRODUCED
    return INCONCLUSIVE


# --------------------------------------------------------------------------- storage


RECALL = {"seen": "sanlab_closed_book_recall", "unseen": "sanlab_closed_book_recall_unseen"}


def final_arms(view: StudyRecord) -> list[tuple[str, dict[int, str]]]:
    """(label, seed -> final run id) of the reference and of each partner at the largest budget."""
    gaps = view.gaps_at(view.largest)
    ref = {int(s): ids["reference"] for g in gaps for s, ids in (g.get("runs") or {}).items()}
    return [(view.reference, dict(sorted(ref.items())))] + [
        (arm_label(g), {int(s): ids["arm"] for s, ids in sorted((g.get("runs") or {}).items(), key=lambda kv: int(kv[0]))})
        for g in gaps]


def _metric(res: dict[str, Any] | None, task: str, key: str) -> float | None:
    v = ((((res or {}).get("tasks") or {}).get(task) or {}).get("metrics") or {}).get(key)
    return float(v) if finite(v) else None


def storage(ax: AxisRecord, slug: str) -> dict[str, dict[str, dict[int, float]]]:
    """Arm label -> {bpp, se, fraction, control} -> seed -> value: the bits per non-embedding
    parameter each final run recalls closed-book (`sanlab_closed_book_recall`: free
    generation, exact match, chance-corrected, times each fact's bits), its sampling
    stderr, the chance-corrected fraction of facts recalled, and the same estimate on the
    unseen-fact control (≈ 0 for an honest count)."""
    view = ax.at(slug)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for label, ids in final_arms(view):
        row: dict[str, dict[int, float]] = {"bpp": {}, "se": {}, "fraction": {}, "control": {}}
        for seed, rid in ids.items():
            res = eval_results(view, rid)
            for key, task, metric in (("bpp", "seen", "stored_bits_per_param"),
                                      ("se", "seen", "stored_bits_per_param_stderr"),
                                      ("fraction", "seen", "stored_fraction"),
                                      ("control", "unseen", "stored_bits_per_param")):
                v = _metric(res, RECALL[task], metric)
                if v is not None:
                    row[key][seed] = v
        out[label] = row
    return out


def fact_reads(ax: AxisRecord, slug: str) -> dict[str, Any] | None:
    """How often the reference's first evaluated final run read each world fact (the
    training rows stating it whole, a row read k times counted k times: `facts.json`)."""
    view = ax.at(slug)
    for rid in run_ids_at(view, "reference", view.largest):
        reads = ((eval_results(view, rid) or {}).get("builtin") or {}).get("fact_reads")
        if isinstance(reads, dict):
            return reads
    return None


def _reads_text(r: dict[str, Any] | None, scale: float = 1.0) -> str:
    if not r or not finite(r.get("median")):
        return "–"
    lo, hi = r.get("p10"), r.get("p90")
    band = f" ({lo * scale:.0f}–{hi * scale:.0f})" if finite(lo) and finite(hi) else ""
    return f"{r['median'] * scale:.0f}{band}"


def learning_curve(ax: AxisRecord, slug: str) -> list[dict[str, Any]]:
    """Per analysed point of training (each milestone, then the final checkpoint): its
    percent, each arm's context-grounded and recall loss above the floor (per seed), and
    the claims arm's Δ recall and Δ context-grounded (per seed pair)."""
    view = ax.at(slug)
    g = ax.claims_gap(slug)
    points = {p: a for p, a in ax.milestones.items() if 0 < p < 100}
    points[100] = view.analyses
    rows = []
    for pct in sorted(points):
        runs: dict[str, Any] = {}
        comps: dict[tuple[Any, Any], dict[str, Any]] = {}
        for a in points[pct]:
            runs.update(a.get("runs") or {})
            comps.update(((c.get("run"), c.get("vs")), c) for c in a.get("comparisons") or [] if isinstance(c, dict))
        above: dict[tuple[str, str], list[float]] = {}
        for label, ids in final_arms(view):
            for kind in ("context", "recall"):
                v = [kind_losses(runs[r].get("losses") or {})[kind]["loss_above_floor"] for r in ids.values() if r in runs]
                above[(label, kind)] = [x for x in v if finite(x)]
        delta: dict[str, dict[int, float]] = {"recall": {}, "context": {}}
        for seed, ids in ((g or {}).get("runs") or {}).items():
            c = comps.get((ids["arm"], ids["reference"]))
            if c is not None:
                for kind, v in zip(("recall", "context"), kind_deltas(c)):
                    if v is not None:
                        delta[kind][int(seed)] = v
        if any(above.values()) or delta["context"]:
            rows.append({"pct": pct, "above": above, "delta": delta})
    return rows


def settled(ax: AxisRecord, slug: str, rows: list[dict[str, Any]]) -> int | None:
    """The first analysed point of training from which the claims arm's context-grounded Δ
    no longer moves: every later step's per-seed-pair change within the noise rule (|mean|
    ≤ F + s, F that value's floor). None when it still moves at the last step, or without
    two analysed points or a floor."""
    floor = ax.at(slug).floor_size
    pts = [r for r in rows if r["delta"]["context"]]
    if len(pts) < 2 or floor is None:
        return None
    for i in range(len(pts) - 1):
        steps = []
        for a, b in zip(pts[i:], pts[i + 1:]):
            ca, cb = a["delta"]["context"], b["delta"]["context"]
            steps.append([cb[k] - ca[k] for k in paired(ca, cb)])
        if all(s and noise.sign(s, floor) == 0 for s in steps):
            return int(pts[i]["pct"])
    return None


# --------------------------------------------------------------------------- claims


CLAIMS = ClaimSet(__name__, RULES_PREAMBLE)


@CLAIMS.claim(
    "recall", "Recall Δ grows with facts per parameter",
    "recall Δ grows: per seed pair, the recall types' token-weighted Δ at the largest world minus at the smallest; "
    "reproduced when it is below 0 (the standard arm's lead on recall widens as the facts per parameter grow), not "
    "reproduced when above 0, else inconclusive.")
def claim_recall(ax: AxisRecord) -> Claim:
    ends = _across(ax, "recall")
    name = "recall Δ grows with facts per parameter (the standard arm's recall lead widens)"
    paper = "the small iso-param gap that remains is parametric recall: recall-heavy types favour the FFN"
    if ends is None:
        return Claim(name, paper, "needs analysed pairs at the smallest and the largest world", INCONCLUSIVE)
    d, floor, lo, hi = ends
    return Claim(name, paper, f"recall Δ {_series_text(ax, 'recall')}; largest − smallest {fmt_ms(d)}; "
                              f"F (quadrature) {fmt(floor, '{:.4f}')}",
                 _sign_verdict(d, floor, -1))


@CLAIMS.claim(
    "context", "Context-grounded Δ ≈ 0 or favouring the SAN",
    "context-grounded Δ ≈ 0 or favouring the SAN: reproduced when at no world size the context-grounded types' "
    "token-weighted Δ is below 0; not reproduced when at some size it is; inconclusive without analysed pairs and a "
    "noise pair at every size.")
def claim_context(ax: AxisRecord) -> Claim:
    signs, missing = [], False
    for slug in ax.slugs:
        v = list(kind_series(ax, slug).get("context", {}).values())
        if not v or ax.at(slug).floor_size is None:  # without a noise pair nothing is within noise either
            missing = True
            continue
        signs.append(noise.sign(v, ax.at(slug).floor_size))
    verdict = (NOT_REPRODUCED if -1 in signs else INCONCLUSIVE if missing or not signs else REPRODUCED)
    return Claim("context-grounded Δ ≈ 0 or favouring the SAN at every world size",
                 "context-grounded types (rag, editing, math) favour the SAN (Δ > 0 here)",
                 f"context-grounded Δ {_series_text(ax, 'context')}; per size vs its F: "
                 + ", ".join({1: "SAN ahead", -1: "standard ahead", 0: "within noise"}[s] for s in signs),
                 verdict)


@CLAIMS.claim(
    "contrast", "Recall types favour the standard arm more than context-grounded types (largest world)",
    "recall vs context-grounded at the largest world: per seed pair, recall Δ − context-grounded Δ; reproduced when "
    "below 0, not reproduced when above 0, else inconclusive.")
def claim_contrast(ax: AxisRecord) -> Claim | None:
    if not ax.slugs:
        return None
    hi = ax.slugs[-1]
    s = kind_series(ax, hi)
    r, c = s.get("recall", {}), s.get("context", {})
    both = paired(r, c)
    diff = [r[k] - c[k] for k in both]
    return Claim(f"recall types favour the standard arm more than context-grounded types "
                 f"({ax.label(hi)})", "recall-heavy types favour FFN, context-grounded types the SAN",
                 f"recall {fmt_ms(list(r.values()))}, context-grounded {fmt_ms(list(c.values()))}; "
                 f"recall − context {fmt_ms(diff)}; F {fmt(ax.at(hi).floor_size, '{:.4f}')}"
                 if diff else "no analysed pairs",
                 _sign_verdict(diff, ax.at(hi).floor_size, -1) if diff else INCONCLUSIVE)


@CLAIMS.claim(
    "query", "The query share of the deficit grows",
    "query share grows: per seed pair, the change of (query Δ − aggregate Δ) from the smallest to the largest world, "
    "and (query Δ − aggregate Δ) at the largest world; reproduced when both are below 0 (the deficit concentrates "
    "on query tokens as the world grows, and is concentrated there at the largest world), not reproduced when "
    "either is above 0, else inconclusive.")
def claim_query(ax: AxisRecord) -> Claim:
    ends = _across(ax, "query_minus_aggregate")
    name = "the query share of the deficit grows with facts per parameter"
    paper = "Δ query −0.052 vs trace −0.008 (31B); at 105B only the query deficit survives (−0.038)"
    if ends is None:
        return Claim(name, paper, "needs analysed pairs at the smallest and the largest world", INCONCLUSIVE)
    d, floor, lo, hi = ends
    shares = _series_text(ax, "query_share", "{:.3f}")
    top = list(kind_series(ax, ax.slugs[-1]).get("query_minus_aggregate", {}).values())
    f_top = ax.at(ax.slugs[-1]).floor_size
    s1, s2 = noise.sign(d, floor), noise.sign(top, f_top)
    verdict = (REPRODUCED if s1 == -1 and s2 == -1 else NOT_REPRODUCED if 1 in (s1, s2) else INCONCLUSIVE)
    return Claim(name, paper, f"query Δ − aggregate Δ {_series_text(ax, 'query_minus_aggregate')}; "
                              f"largest − smallest {fmt_ms(d)}; F (quadrature) {fmt(floor, '{:.4f}')}, "
                              f"F at the largest {fmt(f_top, '{:.4f}')}; "
                              f"query's share of the aggregate Δ {shares}",
                 verdict)


@CLAIMS.claim(
    "zeroshot", "Zero-shot: closed-book QA favours the standard arm, grounded QA does not",
    "zero-shot QA: over every world size and seed pair, the mean accuracy difference (arm − SAN) against twice its "
    "standard error (lm-eval's per-task stderr of both runs in quadrature, divided by √pairs); reproduced when "
    "closed-book QA favours the standard arm beyond it and grounded QA does not; not reproduced when closed-book QA "
    "favours the SAN beyond it or grounded QA favours the standard arm beyond it; else inconclusive.")
def claim_zero_shot(ax: AxisRecord) -> Claim:
    closed, grounded = _pooled(ax, "closed-book"), _pooled(ax, "grounded")

    def txt(p: tuple[float, float, int] | None) -> str:
        return "–" if p is None else f"{p[0]:+.3f} ± {p[1]:.3f} (se, {p[2]} pairs)".replace("-", "−")

    return Claim("zero-shot: closed-book QA favours the standard arm, grounded QA does not",
                 "context-grounded tasks (sciq) favour the SAN; recall tasks (lambada) favour FFN",
                 f"Δacc (arm − SAN) closed-book {txt(closed)}, grounded {txt(grounded)}",
                 verdict_zero_shot(closed, grounded))


@CLAIMS.claim(
    "stored", "The standard arm stores more bits per parameter than the SAN (largest world)",
    "stored bits per parameter at the largest world: per seed pair, the partner's minus the SAN's closed-book "
    "recall count (facts recalled by free generation, exact match, chance-corrected, times each fact's bits, per "
    "non-embedding parameter); reproduced when every pair's difference is above twice its sampling stderr (both "
    "runs' in quadrature), not reproduced when every pair's is below minus twice it, else inconclusive. Shown only "
    "where the final runs were evaluated with the recall task.")
def claim_stored(ax: AxisRecord) -> Claim | None:
    if not ax.slugs:
        return None
    hi = ax.slugs[-1]
    st = storage(ax, hi)
    g = ax.claims_gap(hi)
    ref = st.get(ax.at(hi).reference) or {}
    arm = st.get(arm_label(g)) if g else None
    if not ref.get("bpp") or not arm or not arm.get("bpp"):
        return None
    seeds = paired(ref["bpp"], arm["bpp"])
    d = [arm["bpp"][k] - ref["bpp"][k] for k in seeds]
    se = [math.hypot(arm["se"].get(k, math.nan), ref["se"].get(k, math.nan)) for k in seeds]
    ok = [finite(e) for e in se]
    verdict = (REPRODUCED if d and all(ok) and all(x > 2 * e for x, e in zip(d, se)) else
               NOT_REPRODUCED if d and all(ok) and all(x < -2 * e for x, e in zip(d, se)) else INCONCLUSIVE)
    return Claim(f"the standard arm recalls more bits per parameter than the SAN ({ax.label(hi)})",
                 "the FFN is where facts are stored; a standard transformer stores 2.98 bits/param (SPEC §2)",
                 f"stored bits/param SAN {fmt_ms(list(ref['bpp'].values()), '{:.3f}')}, {arm_label(g)} "
                 f"{fmt_ms(list(arm['bpp'].values()), '{:.3f}')}; per pair Δ "
                 + ", ".join(f"{x:+.3f} ± {e:.3f}".replace("-", "−") for x, e in zip(d, se)),
                 verdict)


RULES = CLAIMS.rules


def claims(ax: AxisRecord) -> list[Claim]:
    return CLAIMS.rows(ax)


# --------------------------------------------------------------------------- blocks


def _each(ax: AxisRecord, block: Callable[[StudyRecord], str]) -> str:
    parts = []
    for slug in ax.slugs:
        x = ax.x(slug)
        head = f"**{ax.label(slug)}**" + (f" ({x:.3f} facts per SAN parameter)" if x is not None else "")
        parts += [head, block(ax.at(slug))]
    return "\n\n".join(parts) if parts else "No data points."


def block_axis(ax: AxisRecord) -> str:
    t = ax.rec.tables.get("data") or {}
    rows = []
    for slug in ax.slugs:
        info = next((p.get("info") or {} for p in ax.points if p["slug"] == slug), {})
        world = info.get("world") or {}
        per = [ax.per_arm(slug, a["name"]) for a in ax.rec.tables.get("arms", [])]
        rows.append([str(ax.value(slug)), f"{world.get('facts', 0):,}" if world else "–",
                     fmt(world.get("bits"), "{:,.0f}"), fmt(world.get("bits_per_fact"), "{:.2f}"),
                     fmt_tokens(info["train_tokens"]) if info.get("train_tokens") else "–",
                     fmt((info.get("floor") or {}).get("val"), "{:.4f}")]
                    + [f"{fmt(p.get('facts_per_param'), '{:.4f}')} / {fmt(p.get('bits_per_param'), '{:.3f}')}"
                       for p in per])
    arms = [f"{a['name']} ({a['params_non_embedding']:,} params): facts / bits per param"
            for a in ax.rec.tables.get("arms", [])]
    head = (f"The data axis: {ax.key} = {', '.join(str(ax.value(s)) for s in ax.slugs)}, each value prepared once "
            f"and shared by every arm; {t.get('sweep') or ''}. Bits: facts × bits per fact, each fact an "
            "independent uniform draw of the generator (`World.information`); per parameter: per non-embedding "
            "parameter (SPEC §1.2's count).")
    return "\n\n".join([head, md_table([ax.key, "facts", "bits", "bits/fact", "train tokens",
                                        "entropy floor (val)"] + arms, rows)])


def block_curve(ax: AxisRecord) -> str:
    rows = []
    for slug in ax.slugs:
        g = ax.claims_gap(slug)
        s = kind_series(ax, slug)
        store = list((g or {}).get("per_seed", {}).values())
        rows.append([str(ax.value(slug)), fmt(ax.x(slug), "{:.3f}"),
                     fmt(ax.per_arm(slug, ax.rec.reference).get("bits_per_param"), "{:.3f}"), fmt_ms(store)]
                    + [fmt_ms(list(s.get(k, {}).values())) for k in
                       ("recall", "context", "query", "trace", "answer", "query_minus_aggregate")]
                    + [fmt_ms(list(s.get("query_share", {}).values()), "{:.3f}"),
                       fmt(ax.at(slug).floor_size, "{:.4f}")])
    g0 = ax.claims_gap(ax.slugs[0]) if ax.slugs else None
    who = arm_label(g0) if g0 else "the partner"
    head = (f"The curve ({who} against the SAN at the largest final budget; mean ± sd over analysed seed pairs). "
            "Δ store: the runs' own validation eval; the other columns are on the analysed sample (`sanlab "
            "analyze`): recall / context-grounded are token-weighted over the recall types "
            f"({', '.join(recall_types())}) and over the others; query share = the query tokens' part of the "
            f"aggregate Δ (Σ share × Δ over query / aggregate Δ). F: that value's noise floor. {SIGN_NOTE} "
            "The figure [delta_vs_axis.png](report/delta_vs_axis.png) draws the recall and context-grounded "
            "columns against facts per parameter.")
    return "\n\n".join([head, md_table(
        [ax.key, "facts/param", "bits/param", "Δ store", "Δ recall", "Δ context", "Δ query", "Δ trace", "Δ answer",
         "query − aggregate", "query share", "F"], rows)])


def block_floor_axis(ax: AxisRecord) -> str:
    """Per value and arm: the loss above the floor, overall and by exercise kind; the aim."""
    rows = []
    aim: list[str] = []
    for i, slug in enumerate(ax.slugs):
        view = ax.at(slug)
        runs = view.runs()
        big = view.largest
        arms = [("reference", view.reference)] + [(g["role"], arm_label(g)) for g in view.gaps_at(big)]
        for role, label in arms:
            ids = [r for r in run_ids_at(view, role, big) if r in runs]
            k = [kind_losses(runs[r].get("losses") or {}) for r in ids]
            losses = [runs[r]["losses"] for r in ids]

            def m(kind: str, key: str) -> float | None:
                v = [x[kind][key] for x in k if finite(x[kind][key])]
                return statistics.fmean(v) if v else None

            tot = [x.get("loss_above_floor") for x in losses if finite(x.get("loss_above_floor"))]
            rows.append([str(ax.value(slug)), label, fmt(statistics.fmean(tot) if tot else None, "{:.4f}"),
                         fmt(m("recall", "loss"), "{:.4f}"), fmt(m("recall", "loss_above_floor"), "{:.4f}"),
                         fmt(m("context", "loss"), "{:.4f}"), fmt(m("context", "entropy_floor"), "{:.4f}"),
                         fmt(m("context", "loss_above_floor"), "{:.4f}")])
            if i == 0:
                c = m("context", "loss_above_floor")
                aim.append(f"{label} {fmt(c, '{:.4f}')}" + ("" if c is None else (" (met)" if c <= AIM else
                                                                                   " (not met)")))
    if not rows:
        return "No analysed final pairs (run `sanlab report STUDY --analyze`)."
    head = ("Loss above the entropy floor on the analysed validation sample (mean over seeds, at the largest final "
            "budget), overall and token-weighted over the recall and the context-grounded types. The aim: the "
            f"smallest world's context-grounded loss within {AIM} nats of its floor for both arms.")
    return "\n\n".join([head, md_table([ax.key, "arm", "above floor (all)", "recall loss", "recall above floor",
                                        "context loss", "context floor", "context above floor"], rows),
                        f"Aim at {ax.label(ax.slugs[0])}: " + "; ".join(aim) + "."])


def block_zero_shot(ax: AxisRecord) -> str:
    rows = []
    for slug in ax.slugs:
        z = zero_shot(ax, slug)
        if not any(r.get("delta") for r in z.values()):
            continue
        row = [str(ax.value(slug))]
        for kind in ZERO_SHOT:
            r = z.get(kind) or {}
            row += [fmt(statistics.fmean(r["san"].values()) if r.get("san") else None, "{:.3f}"),
                    fmt(statistics.fmean(r["arm"].values()) if r.get("arm") else None, "{:.3f}"),
                    fmt_ms(list(r.get("delta", {}).values()), "{:+.3f}")]
        rows.append(row)
    if not rows:
        return ("No zero-shot results (run `sanlab eval RUN_DIR --tasks builtin` on the final runs, then "
                "`sanlab record export`).")
    head = ("Zero-shot accuracy (`sanlab eval --tasks builtin`, lm-eval, 0-shot log-likelihood over lettered choices) "
            "of the final runs, mean over seeds; Δ = arm − SAN, mean ± sd over seed pairs (here Δ > 0: the standard "
            "arm is ahead). Grounded QA reads the answer from notes in the prompt; closed-book QA asks for world "
            "facts the run read; the unseen control asks for facts no row it read states (invented people when it "
            "read every fact), at chance for a model that only recalls.")
    cols = [ax.key]
    for kind in ZERO_SHOT:
        cols += [f"{kind} SAN", f"{kind} arm", f"{kind} Δ"]
    return "\n\n".join([head, md_table(cols, rows)])


def _mean(xs: Any) -> float | None:
    v = [x for x in xs if finite(x)]
    return statistics.fmean(v) if v else None


def block_storage(ax: AxisRecord) -> str:
    rows = []
    labels: list[str] = []
    found = False
    for slug in ax.slugs:
        st, reads = storage(ax, slug), fact_reads(ax, slug)
        labels = labels or list(st)
        found = found or reads is not None or any(v for a in st.values() for v in a.values())
        row = [str(ax.value(slug)), fmt(ax.per_arm(slug, ax.rec.reference).get("bits_per_param"), "{:.3f}"),
               fmt((reads or {}).get("epochs"), "{:.1f}"), _reads_text(reads)]
        row += [f"{fmt_ms(list(st[a]['bpp'].values()), '{:.3f}')} ({fmt(_mean(st[a]['fraction'].values()), '{:.3f}')})"
                for a in labels if a in st]
        row.append(fmt(_mean(v for a in st.values() for v in a["control"].values()), "{:+.3f}"))
        rows.append(row)
    if not found:
        return ("No recall counts (run `sanlab eval RUN_DIR --tasks builtin` on the final runs, then "
                "`sanlab record export`).")
    head = ("What the final runs store, counted independently of the loss: `sanlab_closed_book_recall` asks every "
            "fact the run read (a sample of 400 in a larger world) closed-book and lets the model write the value "
            "(greedy, exact match); each recalled fact counts its bits (log2 of its attribute's number of values), "
            "corrected for a guess that is right 1/K of the time; per non-embedding parameter (the capacity scale of "
            "SPEC §2: a standard transformer stores 2.98 bits/param). In brackets: the chance-corrected fraction of "
            "facts recalled. The unseen control applies the same count to facts no row the run read states "
            "(≈ 0 for an honest count). Passes: rows read / rows in the training split; reads per fact: training "
            "rows read that state it whole (a row read k times counts k), median (p10–p90) over the world's facts.")
    return "\n\n".join([head, md_table([ax.key, "world bits/param (SAN)", "passes over the text",
                                        "reads per fact"] + [f"{a}: stored bits/param (recalled)" for a in labels]
                                       + ["unseen control bits/param"], rows)])


def block_learning(ax: AxisRecord) -> str:
    """The learning-speed confound, measured: per world and analysed point of training, each
    arm's distance to its floor and the claims arm's Δ by kind; where the context Δ settles."""
    parts = []
    for slug in ax.slugs:
        view = ax.at(slug)
        rows = learning_curve(ax, slug)
        if not rows:
            continue
        labels = [a for a, _ in final_arms(view)]
        reads = fact_reads(ax, slug)
        g = ax.claims_gap(slug)
        table = []
        for r in rows:
            tokens = int(view.largest * r["pct"] / 100) if view.largest else None
            table.append([f"{r['pct']}%", fmt_tokens(tokens) if tokens else "–", _reads_text(reads, r["pct"] / 100)]
                         + [fmt(_mean(r["above"].get((a, k), [])), "{:.3f}") for k in ("context", "recall")
                            for a in labels]
                         + [fmt_ms(list(r["delta"][k].values())) for k in ("context", "recall")])
        at = settled(ax, slug, rows)
        last = [r for r in rows if r["delta"]["context"]]
        if at is not None:
            tokens = int(view.largest * at / 100)
            how = (f"The context-grounded Δ stops moving at {at}% of training ({fmt_tokens(tokens)} tokens, "
                   f"≈{_reads_text(reads, at / 100)} reads per fact): every later change within the noise rule "
                   f"(F {fmt(view.floor_size, '{:.4f}')}).")
        elif len(last) >= 2:
            a, b = last[-2]["delta"]["context"], last[-1]["delta"]["context"]
            ch = [b[k] - a[k] for k in paired(a, b)]
            how = (f"The context-grounded Δ is still moving between {last[-2]['pct']}% and {last[-1]['pct']}% of "
                   f"training ({fmt_ms(ch)} against F {fmt(view.floor_size, '{:.4f}')}): the storage regime is "
                   "not reached.")
        else:
            how = "Fewer than two analysed points of training: whether the context-grounded Δ settles is not measured."
        cols = (["training", "tokens", "reads per fact"] + [f"{a} context above floor" for a in labels]
                + [f"{a} recall above floor" for a in labels]
                + [f"Δ context ({arm_label(g) if g else 'partner'})", "Δ recall"])
        parts += [f"**{ax.label(slug)}**", md_table(cols, table), how]
    if not parts:
        return "No analysed pairs (run `sanlab report STUDY --analyze --milestones`)."
    head = ("The learning-speed confound, measured: the final pairs analysed at each milestone checkpoint "
            "(`sanlab report --analyze --milestones`) and at the end, on the same validation sample. Loss above "
            "the floor: token-weighted over the context-grounded and the recall types, mean over seeds; Δ: the "
            "claims arm against the SAN, mean ± sd over seed pairs. Reads per fact at a milestone scale the final "
            f"count by the rows read (≈). {SIGN_NOTE}")
    return "\n\n".join([head, *parts])


def block_summary(ax: AxisRecord) -> str:
    """One row per world: the numbers issue 45's table asks for, with the paper's direction."""
    rows = []
    for slug in ax.slugs:
        view = ax.at(slug)
        labels = [a for a, _ in final_arms(view)]
        curve = learning_curve(ax, slug)
        end = curve[-1] if curve and curve[-1]["pct"] == 100 else None
        s = kind_series(ax, slug)
        z = (zero_shot(ax, slug).get("closed-book") or {}).get("delta", {})
        st = storage(ax, slug)
        rows.append([str(ax.value(slug)), fmt(ax.x(slug), "{:.3f}"),
                     fmt(ax.per_arm(slug, ax.rec.reference).get("bits_per_param"), "{:.3f}"),
                     _reads_text(fact_reads(ax, slug)),
                     " / ".join(fmt(_mean(end["above"].get((a, "context"), [])) if end else None, "{:.3f}")
                                for a in labels),
                     fmt_ms(list(s.get("recall", {}).values())), fmt_ms(list(s.get("context", {}).values())),
                     fmt_ms(list(s.get("query_share", {}).values()), "{:.3f}"),
                     fmt_ms(list(z.values()), "{:+.3f}"),
                     " / ".join(fmt_ms(list((st.get(a) or {}).get("bpp", {}).values()), "{:.3f}") for a in labels)])
    if not rows:
        return "No data points."
    labels = [a for a, _ in final_arms(ax.at(ax.slugs[0]))]
    g = ax.claims_gap(ax.slugs[0])
    rows.append(["paper", "", "", "many", "→ 0 (storage regime)", "< 0, growing with the world",
                 "≈ 0 or > 0", "> token share, growing", "> 0 (standard ahead)", "standard > SAN"])
    head = (f"Summary per world. Context distance: context-grounded loss above its floor ({' / '.join(labels)}); "
            f"Δ recall, Δ context, query share and closed-book Δacc: {arm_label(g) if g else 'the partner'} against "
            "the SAN (mean ± sd over seed pairs); stored bits/param: closed-book recall count per non-embedding "
            f"parameter ({' / '.join(labels)}). The last row: the paper's direction. {SIGN_NOTE}")
    return "\n\n".join([head, md_table([ax.key, "facts/param", "bits/param", "reads per fact",
                                        "context distance to floor", "Δ recall", "Δ context", "query share",
                                        "closed-book Δacc", "stored bits/param"], rows)])


def block_claims(ax: AxisRecord) -> str:
    return CLAIMS.table(claims(ax), SIGN_NOTE)


BLOCKS: dict[str, Callable[[AxisRecord], str]] = {
    "axis": block_axis,
    "curve": block_curve,
    "claims": block_claims,
    "gaps": lambda ax: _each(ax, block_gaps),
    "floor": block_floor_axis,
    "floor-by-value": lambda ax: _each(ax, block_floor),
    "regions": lambda ax: _each(ax, matched.block_regions),
    "exercises": lambda ax: _each(ax, matched.block_exercises),
    "zero-shot": block_zero_shot,
    "storage": block_storage,
    "learning": block_learning,
    "summary": block_summary,
}

__all__ = ["AxisRecord", "BLOCKS", "CLAIMS", "RULES", "claims", "kind_series", "load_axis", "REGIONS"]
