"""The claims of a matched study (SPEC §1.6), each with its verdict: reproduced, not
reproduced or inconclusive, by the rules in `RULES` (written out in docs/records.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sanlab.records.common import (
    CONTENT,
    IDENTITY_TOL,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    ROUTING,
    STUDY,
    arm_label,
    finite,
    fmt,
    fmt_ms,
    fmt_tokens,
    mean_sd,
    rows_of,
)
from sanlab.records.load import (
    Record,
    crystallisation_runs,
    exercise_deltas,
    has_types,
    identity_rows,
    load,
    recall_types,
    region_deltas,
)

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


# --------------------------------------------------------------------------- claims


@dataclass
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str


def claims_arm(rec: Record) -> dict[str, Any] | None:
    """The gap the localisation claims are read on: iso-param (the paper's), else the first arm."""
    gaps = rec.gaps_at(rec.largest)
    return rec.gap("iso-param", rec.largest) or (gaps[0] if gaps else None)


def gap_mean(g: dict[str, Any] | None) -> float | None:
    return g.get("mean") if g and finite(g.get("mean")) else None


def claims(rec: Record, compare: Record | None = None) -> list[Claim]:
    """One row per SPEC §1.6 claim, each with its verdict by the rules of this module's docstring."""
    out = []
    big = rec.largest
    t = noise_threshold(rec, big)
    tt = f"T = {fmt(t, '{:.4f}')}"
    dp, df, dd = (gap_mean(rec.gap(r, big)) for r in ("iso-param", "iso-FLOP", "iso-depth"))
    out.append(Claim("ordering of the gaps: iso-depth > iso-FLOP > iso-param",
                     "Δ iso-depth −0.470, iso-FLOP −0.263, iso-param −0.0055 (105B)",
                     f"at {fmt_tokens(big or 0)}: iso-depth {fmt(dd)}, iso-FLOP {fmt(df)}, iso-param {fmt(dp)}; {tt}",
                     verdict_ordering(dp, df, dd, t)))

    series = [(tok, m) for tok in rec.budgets if (m := gap_mean(rec.gap("iso-param", tok))) is not None]
    out.append(Claim("the iso-param gap shrinks with tokens",
                     "Δ iso-param −0.046 (5B), −0.019 (30B), −0.0055 (105B)",
                     ", ".join(f"{fmt(m)} ({fmt_tokens(tok)})" for tok, m in series) + f"; {tt}"
                     + ("; needs ≥ 2 final budgets" if len(series) < 2 else "") if series else "–",
                     verdict_shrinking(series, t)))

    g = claims_arm(rec)
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
            rows = rows_of(c, "exercise")

            def wmean(names: set[str]) -> float | None:
                sel = [r for k, r in rows.items() if k in names and finite(r.get("delta"))]
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

    errs = [float(i["rel_error"]) for *_, i in identity_rows(rec) if finite(i.get("rel_error"))]
    out.append(Claim("token-weighted region Δs reproduce the aggregate Δ", "within 2%",
                     f"largest relative error {100 * max(errs):.4f}% over {len(errs)} analysed pair(s)" if errs
                     else "no analysed pairs", verdict_identity(errs)))

    crys = crystallisation_runs(rec)
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
            here, there = dp, gap_mean(compare.gap("iso-param", compare.largest))
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

