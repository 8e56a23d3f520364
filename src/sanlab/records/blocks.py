"""The generated README blocks of a matched study: each a function of the record."""

from __future__ import annotations

import statistics
from typing import Any, Callable

from sanlab.records.claims import RULES, RULES_PREAMBLE, claims, load_compare, noise_threshold
from sanlab.records.common import (
    MATRIX_TYPES,
    PAPER_GAP_TEXT,
    PAPER_LOSS_SHARE,
    PAPER_REGION_DELTA,
    PAPER_TOKEN_SHARE,
    REGIONS,
    SIGN_NOTE,
    arm_label,
    finite,
    fmt,
    fmt_ms,
    fmt_tokens,
    md_table,
    per_seed_text,
    per_seed_values,
)
from sanlab.records.load import (
    Record,
    crystallisation_runs,
    exercise_deltas,
    has_types,
    identity_rows,
    noise_pair,
    recall_types,
    region_deltas,
    run_ids_at,
)

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
                     fmt(g.get("reference_loss"), "{:.4f}"), fmt(g.get("arm_loss"), "{:.4f}"), per_seed_text(g),
                     fmt_ms(per_seed_values(g)), per_seed_text(noise) + at, g.get("verdict", "–"),
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
    return float(v) if finite(v) else None


def _mean_loss(rec: Record, role: str, tokens: int) -> float | None:
    if role == "reference":
        vals = [g.get("reference_loss") for g in rec.gaps_at(tokens)]
        vals = [v for v in vals if finite(v)]
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
        ids = run_ids_at(rec, role, rec.largest)
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


def block_regions(rec: Record) -> str:
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
        row += [fmt_ms(deltas[g["arm"]].get(region, [])) for g in gaps]
        row.append(PAPER_REGION_DELTA.get(region, "−0.0055 (105B)" if region == "aggregate" else "–"))
        rows.append(row)
    n = max(len(rec.pairs(g)) for g in gaps)
    head = (f"At {fmt_tokens(rec.largest or 0)}, on the analysed validation sample ({n} seed pair(s); "
            f"Δ mean ± sd over them). Token and loss shares are the SAN's. {SIGN_NOTE}")
    return "\n\n".join([head, md_table(
        ["region", "token share", "loss share (SAN)", "paper token / loss share"]
        + [f"Δ {arm_label(g)}" for g in gaps] + ["paper Δ (iso-param)"], rows)])


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


def block_crystallisation(rec: Record) -> str:
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


def block_claims(rec: Record) -> str:
    rows = [[c.claim, c.paper, c.measured, f"**{c.verdict}**"] for c in claims(rec, load_compare(rec))]
    out = [f"{SIGN_NOTE}", md_table(["claim", "paper (our sign)", "measured", "verdict"], rows)]
    if rec.config.get("prediction"):
        out.append(f"Prediction written before the run: {rec.config['prediction']}")
    keys = ["ordering", "shrinking", "query", "exercise", "identity", "crystallisation"]
    if rec.config.get("compare_with"):
        keys.append("compare")
    out.append("Verdict rules (`sanlab.records.claims`): " + RULES_PREAMBLE + "\n\n"
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

