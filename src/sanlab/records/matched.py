"""Kind `matched`: a SAN against its matched standard partners (SPEC §1.2), with the claims
of SPEC §1.6 and the blocks that show where a gap comes from.

Every comparison of gaps is read against the study's noise rule (`sanlab.study.noise`):
per seed pair, a quantity counts as above / below 0 when |mean| > F + its seed-to-seed
sd, F being the size of the noise-floor pair. The rules, as the README prints them, are
each claim's unit in `CLAIMS` (rule, inputs, verdict; `RULES` collects the rules), which
docs/records.md renders.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable

from sanlab.records.common import (
    CONTENT,
    DOES_NOT_HOLD,
    HOLDS,
    IDENTITY_TOL,
    INCONCLUSIVE,
    MATRIX_TYPES,
    NOT_CHECKED,
    NOT_REPRODUCED,
    PAPER_LOSS_SHARE,
    PAPER_REGION_DELTA,
    PAPER_TOKEN_SHARE,
    REGIONS,
    REPRODUCED,
    ROUTING,
    SIGN_NOTE,
    STUDY,
    Claim,
    ClaimSet,
    arm_label,
    finite,
    fmt,
    fmt_floor,
    fmt_ms,
    fmt_tokens,
    md_table,
    ordering_verdict,
    paired,
    per_seed,
    rows_of,
)
from sanlab.records.study import (
    StudyRecord,
    block_floor,
    block_gaps,
    crystallisation_runs,
    exercise_deltas,
    has_types,
    identity_rows,
    load_study,
    recall_types,
    region_deltas,
    run_ids_at,
)
from sanlab.study import noise

RULES_PREAMBLE = ("Noise rule (`sanlab.study.noise`, the study table's own): a quantity measured per seed pair "
                  "is above / below 0 when |its mean| exceeds F + its seed-to-seed sd (0 with one pair), F being "
                  "the noise-floor pair's size (the larger of |its mean Δ| and its sd); for two independent "
                  "studies F and sd of the difference add in quadrature. Without a noise pair nothing is above "
                  "or below 0.")


def _gap_seeds(rec: StudyRecord, role: str, tokens: int | None) -> dict[int, float]:
    return per_seed(rec.gap(role, tokens))


def _steps_text(steps: list[list[float]]) -> str:
    return ", ".join(fmt_ms(s) for s in steps)


def verdict_ordering(d_param: dict[int, float], d_flop: dict[int, float], d_depth: dict[int, float],
                     floor: float | None) -> str:
    """Paper: iso-depth gap > iso-FLOP gap > iso-param gap, i.e. Δ(depth) < Δ(flop) < Δ(param):
    each step read per seed pair against the noise."""
    seeds = paired(d_param, d_flop, d_depth)
    if not seeds or floor is None:
        return INCONCLUSIVE
    steps = ([d_flop[s] - d_depth[s] for s in seeds], [d_param[s] - d_flop[s] for s in seeds])
    return ordering_verdict(noise.sign(x, floor) for x in steps)


def verdict_shrinking(series: list[dict[int, float]], floor: float | None) -> str:
    """`series`: the iso-param gap's seed -> Δ at each final budget, smallest budget first."""
    seeds = paired(*series)
    if len(series) < 2 or not seeds or floor is None:
        return INCONCLUSIVE
    mags = [[abs(d[s]) for s in seeds] for d in series]
    overall = noise.sign([a - b for a, b in zip(mags[0], mags[-1])], floor)
    if overall == -1:
        return NOT_REPRODUCED
    grows = any(noise.sign([b - a for a, b in zip(m0, m1)], floor) == 1 for m0, m1 in zip(mags, mags[1:]))
    if overall == 1 and not grows:
        return REPRODUCED
    return INCONCLUSIVE


def verdict_query(q_minus_t: list[float], q_minus_agg: list[float], floor: float | None) -> str:
    s1, s2 = noise.sign(q_minus_t, floor), noise.sign(q_minus_agg, floor)
    if s1 == -1 and s2 == -1:
        return REPRODUCED
    if s1 == 1 or s2 == 1:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_exercise(recall: list[float], context: list[float], floor: float | None) -> str:
    r, c = noise.sign(recall, floor), noise.sign(context, floor)
    if r == -1 and c == 1:
        return REPRODUCED
    if r == 1 or c == -1:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def verdict_identity(rel_errors: list[float]) -> str:
    """A check, not a claim: holds / does not hold / not checked."""
    if not rel_errors:
        return NOT_CHECKED
    return HOLDS if all(e <= IDENTITY_TOL for e in rel_errors) else DOES_NOT_HOLD


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


def verdict_compare(here: dict[int, float], there: dict[int, float], floor_here: float | None,
                    floor_there: float | None) -> str:
    """|Δ iso-param| here against there: two independent studies (no seed pairing)."""
    s = noise.sign_of_difference([abs(v) for v in here.values()], [abs(v) for v in there.values()],
                                 floor_here, floor_there)
    return {1: REPRODUCED, -1: NOT_REPRODUCED}.get(s, INCONCLUSIVE)


def claims_arm(rec: StudyRecord) -> dict[str, Any] | None:
    """The gap the localisation claims are read on: iso-param (the paper's), else the first arm."""
    gaps = rec.gaps_at(rec.largest)
    return rec.gap("iso-param", rec.largest) or (gaps[0] if gaps else None)


def gap_mean(g: dict[str, Any] | None) -> float | None:
    return g.get("mean") if g and finite(g.get("mean")) else None


def load_compare(rec: StudyRecord) -> StudyRecord | None:
    """The sibling record `record.toml` names in `compare_with`, if it is there."""
    name = rec.config.get("compare_with")
    if not name:
        return None
    path = rec.dir.parent / name
    if not (path / STUDY / "study.json").is_file():
        return None
    return load_study(path, "matched")


CLAIMS = ClaimSet(__name__, RULES_PREAMBLE)


def _floor_text(rec: StudyRecord) -> str:
    return f"F = {fmt_floor(rec.floor_size)}"


@CLAIMS.claim(
    "ordering", "Ordering (iso-depth > iso-FLOP > iso-param, at the largest budget)",
    "ordering: per seed pair, the steps Δ(iso-FLOP) − Δ(iso-depth) and Δ(iso-param) − Δ(iso-FLOP) at the largest "
    "budget; reproduced when both are above 0, not reproduced when either is below 0; else inconclusive.")
def claim_ordering(rec: StudyRecord) -> Claim:
    big = rec.largest
    gp, gf, gd = (_gap_seeds(rec, r, big) for r in ("iso-param", "iso-FLOP", "iso-depth"))
    dp, df, dd = (gap_mean(rec.gap(r, big)) for r in ("iso-param", "iso-FLOP", "iso-depth"))
    seeds = paired(gp, gf, gd)
    steps = f"; steps {_steps_text([[gf[s] - gd[s] for s in seeds], [gp[s] - gf[s] for s in seeds]])}" if seeds else ""
    return Claim("ordering of the gaps: iso-depth > iso-FLOP > iso-param",
                 "Δ iso-depth −0.470, iso-FLOP −0.263, iso-param −0.0055 (105B)",
                 f"at {fmt_tokens(big or 0)}: iso-depth {fmt(dd)}, iso-FLOP {fmt(df)}, iso-param {fmt(dp)}"
                 f"{steps}; {_floor_text(rec)}", verdict_ordering(gp, gf, gd, rec.floor_size))


@CLAIMS.claim(
    "shrinking", "Iso-param gap shrinking with tokens",
    "iso-param gap shrinking: per seed pair, |Δ| at the smallest minus |Δ| at the largest final budget; reproduced "
    "when it is above 0 and no step to the next budget grows |Δ| (a step above 0); not reproduced when it is below "
    "0 (the gap grew); else inconclusive, also when it shrank overall but grew on the way.",
    note="A gap that ends smaller but grew on the way (|Δ| 0.30 → 0.50 → 0.10) is inconclusive: every budget is "
         "read, not only the ends.")
def claim_shrinking(rec: StudyRecord) -> Claim:
    series = [(tok, m) for tok in rec.budgets if (m := gap_mean(rec.gap("iso-param", tok))) is not None]
    per = [_gap_seeds(rec, "iso-param", tok) for tok, _ in series]
    return Claim("the iso-param gap shrinks with tokens",
                 "Δ iso-param −0.046 (5B), −0.019 (30B), −0.0055 (105B)",
                 ", ".join(f"{fmt(m)} ({fmt_tokens(tok)})" for tok, m in series) + f"; {_floor_text(rec)}"
                 + ("; needs ≥ 2 final budgets" if len(series) < 2 else "") if series else "–",
                 verdict_shrinking(per, rec.floor_size))


@CLAIMS.claim(
    "query", "Deficit on query tokens (the iso-param pair)",
    "query deficit: reproduced when (query Δ − trace Δ) and (query Δ − aggregate Δ) are both below 0; not "
    "reproduced when either is above 0; else inconclusive.")
def claim_query(rec: StudyRecord) -> Claim:
    g = claims_arm(rec)
    deltas = region_deltas(rec, g) if g else {}
    q, tr, agg = deltas.get("query", {}), deltas.get("trace", {}), deltas.get("aggregate", {})
    both = paired(q, tr, agg)
    qt = [q[s] - tr[s] for s in both]
    qa = [q[s] - agg[s] for s in both]
    measured = (f"{arm_label(g)}: query {fmt_ms(list(q.values()))}, trace {fmt_ms(list(tr.values()))}, "
                f"aggregate {fmt_ms(list(agg.values()))}; query − trace {fmt_ms(qt)}, query − aggregate "
                f"{fmt_ms(qa)}; {_floor_text(rec)}") if g and q else (
                    "no query tokens in this corpus" if g and agg else "no analysed pairs")
    return Claim("the SAN's deficit is concentrated on query tokens",
                 "Δ query −0.052 vs trace −0.008 (31B); query −0.038 at 105B", measured,
                 verdict_query(qt, qa, rec.floor_size))


@CLAIMS.claim(
    "exercise", "Recall vs context-grounded types",
    "recall vs context-grounded: reproduced when the recall types' token-weighted Δ is below 0 and the "
    "context-grounded types' above 0; not reproduced when the first is above 0 or the second below 0; else "
    "inconclusive.")
def claim_exercise(rec: StudyRecord) -> Claim:
    name = "recall types favour the standard arm, context-grounded types the SAN"
    g = claims_arm(rec)
    per_type: dict[str, list[float]] = {}
    if g:
        per_type, _ = exercise_deltas(rec, g)
    recall = set(recall_types())
    if not has_types(per_type):
        return Claim(name, "recall-heavy types favour FFN; rag, editing, math favour the SAN",
                     "no exercise types in this corpus" if g and rec.pairs(g) else "no analysed pairs", INCONCLUSIVE)
    assert g is not None
    r_s, c_s = [], []
    for _, c in rec.pairs(g).items():
        rows = rows_of(c, "exercise")

        def wmean(names: set[str]) -> float | None:
            sel = [r for k, r in rows.items() if k in names and finite(r.get("delta"))]
            w = sum(r["tokens"] for r in sel)
            return sum(r["delta"] * r["tokens"] for r in sel) / w if w else None

        r, cc = wmean(recall), wmean(set(rows) - recall)
        if r is not None and cc is not None:
            r_s.append(r)
            c_s.append(cc)
    return Claim(name, "recall-heavy types favour FFN (Δ < 0); rag, editing, math favour the SAN (Δ > 0)",
                 f"{arm_label(g)}: recall {fmt_ms(r_s)}, context-grounded {fmt_ms(c_s)} (token-weighted); "
                 f"{_floor_text(rec)}", verdict_exercise(r_s, c_s, rec.floor_size))


@CLAIMS.claim(
    "identity", "Region identity",
    "region identity (a check of the analysis, exact by construction): holds when every analysed pair's "
    "token-weighted sum of region Δs is within 2% of its aggregate Δ; does not hold otherwise; not checked without "
    "analysed pairs.", check=True,
    note="In sanlab the analysis computes region Δs and the aggregate on the same tokens, so the identity holds to "
         "rounding by construction; the row checks the analysis, not the science, and is listed apart from the "
         "claims.")
def check_identity(rec: StudyRecord) -> Claim:
    errs = [float(i["rel_error"]) for *_, i in identity_rows(rec) if finite(i.get("rel_error"))]
    return Claim("token-weighted region Δs reproduce the aggregate Δ", "within 2%",
                 f"largest relative error {100 * max(errs):.4f}% over {len(errs)} analysed pair(s)" if errs
                 else "no analysed pairs", verdict_identity(errs))


@CLAIMS.claim(
    "crystallisation", "Q/K before V/O/FFN-down",
    "Q/K before V/O/FFN-down: reproduced when in every analysed run that decides it the later of Q, K settles "
    "before the earliest of V, O, down; not reproduced when in none; else inconclusive.",
    note="A run where neither side settles decides nothing; never settling counts as after the end.")
def claim_crystallisation(rec: StudyRecord) -> Claim:
    crys = crystallisation_runs(rec)
    decisions = [settles_before(c) for _, per_run in crys for _, c in per_run]
    yes = sum(1 for d in decisions if d)
    no = sum(1 for d in decisions if d is False)
    return Claim("Q/K crystallise before V/O/FFN-down", "Q, K settle within the first quarter; V, O, down keep "
                 "changing", f"{yes} run(s) before, {no} not, {len(decisions) - yes - no} undecided "
                 f"(at {fmt_tokens(rec.largest or 0)})" if decisions else "no weight spectra",
                 verdict_crystallisation(decisions))


@CLAIMS.claim(
    "compare", "Real text vs the embedded corpus",
    "real text vs embedded corpus: reproduced when |Δ iso-param| here exceeds the compared record's (each at its "
    "largest budget, two independent studies) by more than the noise of the difference; not reproduced when it is "
    "smaller by more than that; else inconclusive.",
    note="Only when `record.toml` names `compare_with`, a sibling record; the `prediction` of `record.toml`, "
         "written before the run, is printed beside it.")
def claim_compare(rec: StudyRecord) -> Claim | None:
    other = rec.config.get("compare_with")
    if not other:
        return None
    paper = "web text: gap predicted 0.02–0.05, measured 0.040 (pre-registered)"
    name = f"the real-text gap is larger than the embedded corpus's ({other})"
    compare = load_compare(rec)
    if compare is None:
        return Claim(name, paper, f"record {other} not found", INCONCLUSIVE)
    big, floor = rec.largest, rec.floor_size
    here, there = _gap_seeds(rec, "iso-param", big), _gap_seeds(compare, "iso-param", compare.largest)
    ah, at = [abs(v) for v in here.values()], [abs(v) for v in there.values()]
    return Claim(name, paper,
                 f"|Δ iso-param| here {fmt_ms(ah, '{:.4f}')} ({fmt_tokens(big or 0)}) vs {other} "
                 f"{fmt_ms(at, '{:.4f}')} "
                 f"({fmt_tokens(compare.largest or 0)}); F here {fmt(floor, '{:.4f}')}, there "
                 f"{fmt(compare.floor_size, '{:.4f}')}",
                 verdict_compare(here, there, floor, compare.floor_size))


RULES = CLAIMS.rules


def claims(rec: StudyRecord) -> list[Claim]:
    """One row per SPEC §1.6 claim (and the region identity check), each by its unit."""
    return CLAIMS.rows(rec)


# --------------------------------------------------------------------------- blocks


def block_regions(rec: StudyRecord) -> str:
    gaps = rec.gaps_at(rec.largest)
    if not gaps or not any(rec.pairs(g) for g in gaps):
        return "No analysed final pairs at the largest budget (run `sanlab report STUDY --analyze`)."
    ref_runs = rec.runs()
    ref_ids = [r for r in run_ids_at(rec, "reference", rec.largest) if r in ref_runs]
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
        row += [fmt_ms(list(deltas[g["arm"]].get(region, {}).values())) for g in gaps]
        row.append(PAPER_REGION_DELTA.get(region, "−0.0055 (105B)" if region == "aggregate" else "–"))
        rows.append(row)
    n = max(len(rec.pairs(g)) for g in gaps)
    head = (f"At {fmt_tokens(rec.largest or 0)}, on the analysed validation sample ({n} seed pair(s); "
            f"Δ mean ± sd over them). Token and loss shares are the SAN's. {SIGN_NOTE}")
    return "\n\n".join([head, md_table(
        ["region", "token share", "loss share (SAN)", "paper token / loss share"]
        + [f"Δ {arm_label(g)}" for g in gaps] + ["paper Δ (iso-param)"], rows)])


def block_exercises(rec: StudyRecord) -> str:
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


def block_identity(rec: StudyRecord) -> str:
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


def block_crystallisation(rec: StudyRecord) -> str:
    runs = crystallisation_runs(rec)
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


def block_claims(rec: StudyRecord) -> str:
    text = CLAIMS.table(claims(rec), SIGN_NOTE)
    if rec.config.get("prediction"):
        head, rules = text.rsplit("\n\nVerdict rules", 1)
        text = f"{head}\n\nPrediction written before the run: {rec.config['prediction']}\n\nVerdict rules{rules}"
    return text


BLOCKS: dict[str, Callable[[StudyRecord], str]] = {
    "gaps": block_gaps,
    "floor": block_floor,
    "regions": block_regions,
    "exercises": block_exercises,
    "identity": block_identity,
    "crystallisation": block_crystallisation,
    "claims": block_claims,
}
