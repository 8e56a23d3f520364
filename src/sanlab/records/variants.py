"""Kind `variants`: a standard transformer against variants of its attention (SPEC §3 arms,
`examples/variants.toml`: no SAN, no matched arms), with the perplexity claims of SPEC §3
("Deconstructing Attention") and the LM claim of SPEC §2.

Each arm is recognised from what the study built (`arms` of the study's tables: mixer,
layout, frozen groups), not from its name. The study's loss is the validation loss in nats,
i.e. the log-perplexity, so the paper's perplexity ordering is read on it directly (the
perplexity exp(loss) has the same order). Comparisons are per seed pair against the
study's noise rule (`sanlab.study.noise`): the loss of arm b minus that of arm a, per
seed (the reference's loss cancels from their gaps), above 0 when |mean| > F + its sd.

NLU (zero-shot accuracy) is not something a study measures; its claim says so.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from sanlab.records.common import (
    INCONCLUSIVE,
    Claim,
    ClaimSet,
    fmt,
    fmt_floor,
    fmt_ms,
    fmt_tokens,
    md_table,
    ordering_verdict,
    paired,
    per_seed,
)
from sanlab.records.study import StudyRecord, block_floor, block_gaps, losses_at
from sanlab.study import noise

# SPEC §3 (500M, 15B tokens): NLU average and WikiText perplexity; SPEC §2 (Wikitext-103):
# LM log-perplexity. Keys are the variants as `variant_of` names them.
PAPER = {
    "standard": {"label": "standard", "nlu": 51.9, "ppl": 38.1, "logppl": 2.78},
    "nonapprox_hybrid": {"label": "Non-approximate (hybrid)", "nlu": 52.9, "ppl": 39.4},
    "approximate": {"label": "Approximate", "nlu": 50.2, "ppl": 47.9},
    "static_emb_qk": {"label": "StaticEmbQK", "nlu": 49.4, "ppl": 79.9},
    "rnd_emb_qk": {"label": "RndEmbQK", "nlu": 48.0, "ppl": 84.8},
    "mlp": {"label": "MLP (uniform)", "nlu": 40.0, "ppl": 993.5},
    "nonapprox_uniform": {"label": "Non-approximate (uniform)", "nlu": 39.3, "ppl": 9e4},
    "fixed_seq_qk": {"label": "FixedSeqQK"},
    "frozen_qk": {"label": "Frozen-QK", "logppl": 3.07},
    "mixit": {"label": "MixiT", "logppl": 3.73},
    "frozen_mlp": {"label": "Frozen-MLP"},
}
# The orderings the papers' numbers give, best first.
PPL_ORDER = ("standard", "nonapprox_hybrid", "approximate", "static_emb_qk", "rnd_emb_qk", "mlp",
             "nonapprox_uniform")
LM_ORDER = ("standard", "frozen_qk", "mixit")
SIGN_NOTE = ("Δ = arm − standard validation loss (nats, i.e. log-perplexity); Δ > 0: the variant is behind "
             "the standard transformer.")

RULES_PREAMBLE = ("Noise rule (`sanlab.study.noise`, the study table's own): a quantity measured per seed pair "
                  "is above / below 0 when |its mean| exceeds F + its seed-to-seed sd (0 with one pair), F being "
                  "the noise-floor pair's size. Without a noise pair nothing is above or below 0.")


def variant_of(arm: dict[str, Any]) -> str | None:
    """The SPEC §2–3 variant an arm of the study's tables is (None: none of them). An arm
    with `mixer_options` (`with_options` adds the spec's) that depart from the paper's form
    (MixiT's σ_h not at the document's length, Non-approximate with QK-norm) is an ablation
    of the variant, not the variant."""
    mixer, layout, freeze = arm.get("mixer", "softmax"), arm.get("layout", "uniform"), arm.get("freeze") or []
    if _ablation_of(arm) is not None:
        return None
    if arm.get("state_mixer", "swiglu") == "none" and mixer == "softmax":
        return None  # an attention-only model is the SAN, not a variant of SPEC §3
    if freeze:
        if mixer == "softmax" and layout == "uniform" and freeze == ["qk"]:
            return "frozen_qk"
        if mixer == "softmax" and layout == "uniform" and freeze == ["mlp"]:
            return "frozen_mlp"
        return None
    if mixer == "softmax":
        return "standard" if layout == "uniform" else None
    if mixer == "non_approximate":
        return {"uniform": "nonapprox_uniform", "hybrid": "nonapprox_hybrid"}.get(layout) if isinstance(layout, str) else None
    if layout != "uniform":
        return None
    return mixer if mixer in PAPER else None


# The forms this project ran before, each the ablation of one SPEC §2–3 variant's literal
# form: (variant, what differs, test on the arm, the paper's form in words, the ablation's).
ABLATIONS = (
    ("mixit", lambda a: a.get("mixer") == "mixit" and a.get("layout", "uniform") == "uniform"
     and (a.get("mixer_options") or {}).get("sigma_length", "document") != "document",
     "σ_h at each document's length", "σ_h(seq_len) on every row"),
    ("frozen_qk", lambda a: a.get("mixer", "softmax") == "softmax" and a.get("layout", "uniform") == "uniform"
     and (a.get("freeze") or []) == ["qk_proj"], "W_q, W_k and the QK-norm gains frozen",
     "W_q, W_k frozen, the QK-norm gains trained"),
    ("nonapprox_uniform", lambda a: a.get("mixer") == "non_approximate" and a.get("layout", "uniform") == "uniform"
     and bool((a.get("mixer_options") or {}).get("qk_norm", False)), "no QK-norm (SPEC §3 literally)",
     "QK-norm on SiLU(q) and k"),
)


def _ablation_of(arm: dict[str, Any]) -> str | None:
    return next((v for v, test, _, _ in ABLATIONS if test(arm)), None)


def with_options(rec: StudyRecord, arm: dict[str, Any]) -> dict[str, Any]:
    """A tables arm with its `mixer_options` from the study's spec (the tables omit them)."""
    spec_arm = next((a for a in rec.spec.get("arms") or [] if isinstance(a, dict) and a.get("name") == arm["name"]),
                    None)
    model = (spec_arm or {}).get("model") or {}
    return {**arm, "mixer_options": model.get("mixer_options") or {}}


def ablations(rec: StudyRecord) -> dict[str, str]:
    """Variant -> the study's arm that is its ablation (the project's previous form)."""
    out: dict[str, str] = {}
    for a in rec.tables.get("arms", []):
        v = _ablation_of(with_options(rec, a))
        if v is not None and v not in out:
            out[v] = a["name"]
    return out


def variants(rec: StudyRecord) -> dict[str, str]:
    """Variant -> the study's arm that is it (the first, if several are)."""
    out: dict[str, str] = {}
    for a in rec.tables.get("arms", []):
        v = variant_of(with_options(rec, a))
        if v is not None and v not in out:
            out[v] = a["name"]
    return out


def arm_losses(rec: StudyRecord, arm: str, tokens: int | None) -> dict[int, float]:
    """Seed -> final val loss of an arm (the reference included) at a budget."""
    if arm == rec.reference:
        return losses_at(rec, "reference", tokens)
    return per_seed(rec.gap_of(arm, tokens), "arm_per_seed")


def arm_deltas(rec: StudyRecord, arm: str, tokens: int | None) -> dict[int, float]:
    """Seed -> Δ = arm − reference (0 for the reference itself, where it has a loss)."""
    if arm == rec.reference:
        return {s: 0.0 for s in losses_at(rec, "reference", tokens)}
    return per_seed(rec.gap_of(arm, tokens))


def step(rec: StudyRecord, a: str, b: str, tokens: int | None) -> list[float]:
    """Per seed pair: loss(b) − loss(a), as the difference of their gaps to the reference."""
    da, db = arm_deltas(rec, a, tokens), arm_deltas(rec, b, tokens)
    return [db[s] - da[s] for s in paired(da, db)]


def _order_claim(rec: StudyRecord, order: tuple[str, ...], claim: str, paper: str) -> Claim:
    big, floor = rec.largest, rec.floor_size
    have = variants(rec)
    present = [v for v in order if v in have and arm_deltas(rec, have[v], big)]
    steps = [step(rec, have[a], have[b], big) for a, b in zip(present, present[1:])]
    measured = ", ".join(f"{PAPER[v]['label']} {fmt(_mean_loss(rec, have[v], big), '{:.4f}')}" for v in present)
    measured = (f"at {fmt_tokens(big or 0)}: {measured}" if present else "no such arm in the study")
    if steps:
        measured += f"; steps {', '.join(fmt_ms(s) for s in steps)}"
    measured += f"; F = {fmt_floor(floor)}"
    verdict = INCONCLUSIVE if len(present) < 2 else ordering_verdict(noise.sign(s, floor) for s in steps)
    return Claim(claim, paper, measured, verdict)


def _mean_loss(rec: StudyRecord, arm: str, tokens: int | None) -> float | None:
    losses = arm_losses(rec, arm, tokens)
    return sum(losses.values()) / len(losses) if losses else None


CLAIMS = ClaimSet(__name__, RULES_PREAMBLE)


@CLAIMS.claim(
    "ppl", "Perplexity ordering (SPEC §3: standard 38.1 < hybrid Non-approximate 39.4 < Approximate 47.9 < "
    "StaticEmbQK 79.9 < RndEmbQK 84.8 < uniform MLP 993.5 < uniform Non-approximate 9e4)",
    "perplexity ordering (SPEC §3): the variants present, in the paper's order of WikiText perplexity; each step is "
    "the next arm's loss minus this one's, per seed pair; reproduced when every step is above 0, not reproduced "
    "when a step is below 0, else inconclusive (also with fewer than two arms).")
def claim_ppl(rec: StudyRecord) -> Claim:
    return _order_claim(rec, PPL_ORDER, "perplexity: standard < hybrid < Approximate < StaticEmbQK < RndEmbQK < "
                        "MLP < Non-approximate (uniform)", "WikiText ppl 38.1 / 39.4 / 47.9 / 79.9 / 84.8 / 993.5 / 9e4")


@CLAIMS.claim(
    "hybrid", "The hybrid recovers",
    "hybrid recovers: uniform Non-approximate's loss minus the hybrid's, per seed pair; reproduced when above 0, not "
    "reproduced when below 0, else inconclusive (also when either arm is missing).")
def claim_hybrid(rec: StudyRecord) -> Claim:
    have, big, floor = variants(rec), rec.largest, rec.floor_size
    name = "hybrid layout recovers: Non-approximate in odd layers ≪ Non-approximate in every layer"
    paper = "WikiText ppl 39.4 (hybrid) vs 9e4 (uniform); standard 38.1"
    if "nonapprox_hybrid" not in have or "nonapprox_uniform" not in have:
        return Claim(name, paper, "the study lacks the hybrid or the uniform Non-approximate arm", INCONCLUSIVE)
    x = step(rec, have["nonapprox_hybrid"], have["nonapprox_uniform"], big)
    sign = noise.sign(x, floor)
    return Claim(name, paper, f"loss(uniform) − loss(hybrid) {fmt_ms(x)} at {fmt_tokens(big or 0)}; "
                 f"F = {fmt_floor(floor)}", ordering_verdict([sign]))


@CLAIMS.claim(
    "lm", "LM log-perplexity (SPEC §2: standard 2.78 < Frozen-QK 3.07 < MixiT 3.73)",
    "LM log-perplexity (SPEC §2): standard < Frozen-QK < MixiT, read as the perplexity ordering.")
def claim_lm(rec: StudyRecord) -> Claim:
    return _order_claim(rec, LM_ORDER, "LM log-perplexity: standard < Frozen-QK < MixiT",
                        "Wikitext-103 log-ppl 2.78 / 3.07 / 3.73")


@CLAIMS.claim(
    "nlu", "NLU",
    "NLU: a study records validation loss only; the NLU claim is inconclusive until zero-shot accuracies are "
    "recorded.")
def claim_nlu(rec: StudyRecord) -> Claim:
    return Claim("NLU average: hybrid > standard > Approximate > StaticEmbQK > RndEmbQK > MLP > "
                 "Non-approximate (uniform)", "NLU 52.9 / 51.9 / 50.2 / 49.4 / 48.0 / 40.0 / 39.3",
                 "not measured (a study records validation loss; zero-shot NLU needs `sanlab eval`)", INCONCLUSIVE)


def block_variants(rec: StudyRecord) -> str:
    """Per arm at the largest budget: which variant it is, its loss (log-ppl) and perplexity,
    Δ to the standard arm, and the papers' numbers."""
    big = rec.largest
    rows = []
    for a in rec.tables.get("arms", []):
        if a.get("role") == "noise":
            continue
        v = variant_of(with_options(rec, a))
        p = PAPER.get(v or "", {})
        losses = list(arm_losses(rec, a["name"], big).values())
        m = sum(losses) / len(losses) if losses else None
        ppl = None if m is None or m > 700 else math.exp(m)
        rows.append([a["name"], p.get("label", "– (not a SPEC §2–3 variant)"), a["label"], fmt_ms(losses, "{:.4f}"),
                     fmt(ppl, "{:.1f}"), fmt_ms(list(arm_deltas(rec, a["name"], big).values())),
                     f"{p['ppl']:g}" if "ppl" in p else "–", f"{p['nlu']:g}" if "nlu" in p else "–",
                     f"{p['logppl']:g}" if "logppl" in p else "–"])
    if not rows:
        return "No arms in the study's tables."
    head = (f"At {fmt_tokens(big or 0)} (mean ± sd over seeds). {SIGN_NOTE} The papers' models are far larger "
            "(SPEC §3: 500M parameters, 15B tokens), so their perplexities are not comparable in size; their "
            "order is.")
    return "\n\n".join([head, md_table(["arm", "variant", "config", "val loss (log-ppl)", "ppl", "Δ vs standard",
                                        "paper ppl (§3)", "paper NLU (§3)", "paper log-ppl (§2)"], rows)])


def _paper_cell(rec: StudyRecord) -> Callable[[dict[str, Any]], str]:
    def paper(g: dict[str, Any]) -> str:
        arm = rec.arm(g["arm"]) or {}
        p = PAPER.get((variant_of(with_options(rec, arm)) if arm else None) or "", {})
        return f"ppl {p['ppl']:g}" if "ppl" in p else (f"log-ppl {p['logppl']:g}" if "logppl" in p else "–")
    return paper


def block_variant_gaps(rec: StudyRecord) -> str:
    return block_gaps(rec, SIGN_NOTE, _paper_cell(rec), "paper (SPEC §3 ppl, §2 log-ppl)")


def block_ablations(rec: StudyRecord) -> str:
    """Each variant in the paper's form against the form this project ran before, per seed
    pair at the largest budget: Δ = loss(previous form) − loss(paper's form)."""
    have, abl, big, floor = variants(rec), ablations(rec), rec.largest, rec.floor_size
    rows = []
    for v, _, paper_form, old_form in ABLATIONS:
        if v not in have or v not in abl:
            continue
        x = step(rec, have[v], abl[v], big)
        sign = noise.sign(x, floor) if x else 0
        word = {1: "previous form worse", -1: "previous form better", 0: "within noise"}[sign]
        rows.append([PAPER[v]["label"], f"{have[v]}: {paper_form}", fmt(_mean_loss(rec, have[v], big), "{:.4f}"),
                     f"{abl[v]}: {old_form}", fmt(_mean_loss(rec, abl[v], big), "{:.4f}"), fmt_ms(x), word])
    if not rows:
        return "The study has no ablation arm (a variant in the project's previous form)."
    head = (f"At {fmt_tokens(big or 0)} (mean over seeds). Δ = loss(previous form) − loss(paper's form) per seed "
            f"pair, mean ± sd; read against F = {fmt_floor(floor)} by the noise rule below.")
    return "\n\n".join([head, md_table(["variant", "paper's form (arm)", "val loss", "previous form (arm)",
                                        "val loss", "Δ", "reading"], rows)])


def peak_activations(rec: StudyRecord, arm: str, tokens: int | None) -> dict[int, list[float]]:
    """Seed -> the largest |activation| at each residual-stream hook (the analysis's
    `stream[].max_abs`, embedding output first), for an arm's final runs that were analysed."""
    runs = rec.runs()
    out: dict[int, list[float]] = {}
    for g in rec.gaps_at(tokens):
        for seed, ids in (g.get("runs") or {}).items():
            rid = ids["reference"] if arm == rec.reference else (ids["arm"] if g["arm"] == arm else None)
            stream = (runs.get(rid) or {}).get("stream") if rid else None
            if isinstance(stream, list) and stream:
                out[int(seed)] = [float(h["max_abs"]) for h in stream]
    return out


def block_activations(rec: StudyRecord) -> str:
    """The largest activation per layer for every analysed arm (SPEC §3: ~10³ in uniform
    Non-approximate against ~10¹ in the hybrid)."""
    big = rec.largest
    rows, width = [], 0
    for a in rec.tables.get("arms", []):
        if a.get("role") == "noise":
            continue
        peaks = peak_activations(rec, a["name"], big)
        if not peaks:
            continue
        per_hook = [sum(p[i] for p in peaks.values()) / len(peaks) for i in range(min(map(len, peaks.values())))]
        width = max(width, len(per_hook))
        rows.append((a["name"], max(per_hook), per_hook))
    if not rows:
        return "No final run of the study was analysed (`sanlab report STUDY --analyze`)."
    heads = ["arm", "largest", "embedding"] + [f"after block {i}" for i in range(width - 1)]
    table = [[n, f"{m:.1f}"] + [f"{x:.1f}" for x in h] + ["–"] * (width - len(h)) for n, m, h in rows]
    return "\n\n".join([f"At {fmt_tokens(big or 0)}: the largest |activation| in the residual stream at each "
                         "block's output (mean over the analysed seeds; the analysis's `stream.csv`, `max_abs`).",
                         md_table(heads, table)])


@CLAIMS.claim(
    "activations", "Largest activation (SPEC §3: ~10³ in uniform Non-approximate against ~10¹ in the hybrid)",
    "largest activation: the uniform Non-approximate arm's largest |activation| anywhere in the residual stream over "
    "the hybrid's, per analysed seed; reproduced when every ratio is at least 10 (the paper's is ~100), not "
    "reproduced when every ratio is at most 1, else inconclusive.")
def claim_activations(rec: StudyRecord) -> Claim:
    have, big = variants(rec), rec.largest
    name = "largest activation: uniform Non-approximate ≫ hybrid"
    paper = "~10³ (uniform) vs ~10¹ (hybrid)"
    if "nonapprox_uniform" not in have or "nonapprox_hybrid" not in have:
        return Claim(name, paper, "the study lacks the hybrid or the uniform Non-approximate arm", INCONCLUSIVE)
    u = {s: max(p) for s, p in peak_activations(rec, have["nonapprox_uniform"], big).items()}
    h = {s: max(p) for s, p in peak_activations(rec, have["nonapprox_hybrid"], big).items()}
    seeds = sorted(set(u) & set(h))
    if not seeds:
        return Claim(name, paper, "neither arm's final runs were analysed", INCONCLUSIVE)
    ratios = [u[s] / h[s] for s in seeds]
    measured = (f"uniform {', '.join(f'{u[s]:.1f}' for s in seeds)} vs hybrid {', '.join(f'{h[s]:.1f}' for s in seeds)}"
                f" (seeds {', '.join(map(str, seeds))}); ratio {', '.join(f'{r:.2f}' for r in ratios)}")
    verdict = ("reproduced" if all(r >= 10 for r in ratios) else
               "not reproduced" if all(r <= 1 for r in ratios) else INCONCLUSIVE)
    return Claim(name, paper, measured, verdict)


RULES = CLAIMS.rules


def claims(rec: StudyRecord) -> list[Claim]:
    return CLAIMS.rows(rec)


def block_claims(rec: StudyRecord) -> str:
    return CLAIMS.table(claims(rec), SIGN_NOTE, paper="paper")


BLOCKS: dict[str, Callable[[StudyRecord], str]] = {
    "gaps": block_variant_gaps,
    "variants": block_variants,
    "ablations": block_ablations,
    "activations": block_activations,
    "floor": block_floor,
    "claims": block_claims,
}
