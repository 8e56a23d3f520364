"""A study as the report reads it (`sanlab.report.data.StudyData`), written by hand so the
figure tests know every number behind every figure without training anything.

The study: the SAN reference and three matched arms (iso-param, iso-FLOP, iso-depth) plus
the noise-floor control, two seeds, two final budgets, a sweep per arm, training curves
with evaluations, and paired analyses of the largest budget (regions, exercise types with
one thin and two absent types, spectra, attention, stream and gates).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sanlab.report.data import Curve, StudyData

ARMS = ("san", "iso_param", "iso_flop", "iso_depth")
ROLES = {"san": "reference", "iso_param": "iso-param", "iso_flop": "iso-FLOP", "iso_depth": "iso-depth"}
SIZES = {"san": 61_000, "iso_param": 60_700, "iso_flop": 120_000, "iso_depth": 310_000}
LAYERS = {"san": 5, "iso_param": 1, "iso_flop": 2, "iso_depth": 5}
NOISE = "san_rms"
SEEDS = (1, 2)
BUDGETS = (500_000, 1_000_000)
EXERCISES = ("memorization", "mcq", "rag", "math", "math-mcq", "cooking", "editing", "creative-writing")
ABSENT = ("editing", "creative-writing")  # in the corpus, not in the analysed sample
TOKENS = {"memorization": 1620, "mcq": 356, "rag": 540, "math": 377, "math-mcq": 12, "cooking": 374}
REGION_TOKENS = {"other": 150, "query": 420, "trace": 2100, "answer": 609}
FLOOR = 0.004  # the noise pair's mean gap; its seed spread is smaller
# Per arm (not the SAN) the seed pairs' Δ by group at the largest budget: seed 1 = base − 0.05,
# seed 2 = base + 0.05, so mean = base and sample sd = 0.0707 (population sd 0.05).
GROUP_BASE = {"iso_param": -0.30, "iso_flop": -0.40, "iso_depth": -0.50}
SPREAD = 0.05


def run_id(arm: str, tokens: int, seed: int, lr: float = 0.04) -> str:
    return f"{arm}-L{LAYERS.get(arm, 5)}-d64-muon-lr{lr:g}-{tokens // 1000}K-s{seed}"


def gap_mean(arm: str, tokens: int) -> float:
    return {"iso_param": -0.30, "iso_flop": -0.42, "iso_depth": -0.51}[arm] * (0.9 if tokens == BUDGETS[1] else 1.0)


def _curve(final_loss: float, steps: int, eval_every: int, tokens_per_step: int = 2048) -> Curve:
    c = Curve()
    for s in range(1, steps + 1):
        t = s * tokens_per_step
        c.tokens.append(t)
        trend = final_loss + 2.0 * math.exp(-4.0 * s / steps)
        c.loss.append(trend + 0.08 * math.sin(1.7 * s))  # noisy per step
        if s % eval_every == 0 or s == steps:
            c.val_tokens.append(t)
            c.val_loss.append(trend + 0.01)
    return c


def _spectra(arm: str) -> dict[str, Any]:
    """Mean stable rank per type over 5 milestones: Q settles at 25% (flat afterwards), O keeps
    changing, `down` (FFN arms) falls steeply although the old shape-only rule called it
    settled at 0% (its entry here carries that stale milestone)."""
    ms = (0.0, 0.25, 0.5, 0.75, 1.0)
    curves = {"Q": [16.0, 30.0, 30.1, 30.2, 30.25], "K": [11.0, 16.0, 15.0, 12.0, 11.0],
              "V": [11.0, 12.0, 11.0, 10.0, 9.5], "O": [16.0, 24.0, 19.0, 16.0, 15.0]}
    if arm != "san":
        curves |= {"gate": [30.0, 34.0, 33.0, 31.0, 30.0], "up": [29.0, 34.0, 33.0, 31.0, 30.0],
                   "down": [28.5, 22.8, 19.9, 19.8, 19.8]}
    per_type = [{"milestone": m, "type": t, "layers": LAYERS[arm], "stable_rank": v[i], "effective_rank": 2 * v[i],
                 "spectral_norm": 1.0} for t, v in curves.items() for i, m in enumerate(ms)]
    crystal = [{"type": "Q", "milestone": 0.25, "distances": [0.2, 0.01, 0.01, 0.01], "rank_changes": []}]
    crystal += [{"type": t, "milestone": None, "distances": [0.1] * 4, "rank_changes": []} for t in ("K", "V", "O")]
    if arm != "san":
        crystal.append({"type": "down", "milestone": 0.0, "distances": [0.01] * 4})  # the stale rule's point
        crystal += [{"type": t, "milestone": None, "distances": [0.1] * 4} for t in ("gate", "up")]
    return {"tol": 0.02, "per_matrix": [], "per_type": per_type, "crystallisation": crystal}


def _attention(arm: str) -> dict[str, Any]:
    layers = [{"layer": i, "entropy": 3.0 + 0.04 * i + (0.3 if arm == "iso_param" else 0.0),
               "concentration": 0.3, "sink": 0.02 + 0.002 * i, "local_0": 0.1 + 0.01 * i, "local_1": 0.05,
               "local_2": 0.04, "local_3": 0.03, "head_diversity": 0.01 + 0.001 * i} for i in range(LAYERS[arm])]
    return {"heads": [], "layers": layers}


def _stream(arm: str) -> tuple[list[dict], list[dict]]:
    stream = [{"hook": "blocks.0.resid_pre", "rms": 5.0, "max_abs": 20.0, "rep_rank": 10.0}]
    stream += [{"hook": f"blocks.{i}.resid_post", "rms": 8.0 + 4 * i, "max_abs": 30.0, "rep_rank": 12.0}
               for i in range(LAYERS[arm])]
    gates = [{"layer": i, "attn": 0.49 + 0.004 * i, "ffn": None if arm == "san" else 0.505 - 0.003 * i}
             for i in range(LAYERS[arm])]
    return stream, gates


def _group_rows(names: dict[str, int], deltas: dict[str, float], one_pair: bool) -> dict[str, Any]:
    n = sum(names.values())
    rows = []
    for g, k in names.items():
        d = deltas[g]
        row = {"group": g, "tokens": k, "token_share": k / n, "loss_a": 4.0 + d, "loss_b": 4.0, "delta": d,
               "weighted": k / n * d, "contribution": 0.0}
        if one_pair:
            row["delta_lo"], row["delta_hi"] = d - 0.03, d + 0.02
        rows.append(row)
    agg = sum(r["weighted"] for r in rows)
    return {"rows": rows, "identity": {"aggregate_delta": agg, "weighted_sum": agg, "abs_error": 0.0,
                                       "rel_error": 0.0}}


def analyses(seeds: tuple[int, ...] = SEEDS) -> list[dict[str, Any]]:
    """One analysis file per seed pair group (every arm vs the SAN at the largest budget)."""
    tokens = BUDGETS[-1]
    out = []
    for k, seed in enumerate(seeds):
        runs: dict[str, Any] = {}
        comps = []
        for arm in ARMS:
            rid = run_id(arm, tokens, seed)
            stream, gates = _stream(arm)
            runs[rid] = {"config": {"residual": "gated", "n_layers": LAYERS[arm]}, "spectra": _spectra(arm),
                         "attention": _attention(arm), "stream": stream, "gates": gates}
            if arm == "san":
                continue
            shift = -SPREAD if seed == 1 else SPREAD
            ex = {g: GROUP_BASE[arm] + shift + 0.01 * i for i, g in enumerate(TOKENS)}
            reg = {g: GROUP_BASE[arm] + shift + 0.02 * i for i, g in enumerate(REGION_TOKENS)}
            comps.append({"run": rid, "vs": run_id("san", tokens, seed),
                          "region": _group_rows(REGION_TOKENS, reg, len(seeds) == 1),
                          "exercise": _group_rows(TOKENS, ex, len(seeds) == 1), "recorded_val_delta": -0.3})
        out.append({"runs": runs, "comparisons": comps, "_path": f"analysis/final-muon-{tokens}-s{seed}/analysis.json",
                    "_mtime": float(k), "attention_normalized": False,
                    "sample": {"rows": 77, "seq_len": 128, "tokens": 3279, "exercises": list(EXERCISES),
                               "rows_rule": "--eval-rows 77"}})
    return out


def tables() -> dict[str, Any]:
    gaps = []
    for arm in ARMS[1:]:
        for tokens in BUDGETS:
            m = gap_mean(arm, tokens)
            per = {"1": m - 0.01, "2": m + 0.01}
            ratio = abs(m) / FLOOR
            gaps.append({"arm": arm, "role": ROLES[arm], "label": f"{LAYERS[arm]}L d64, d_ff 256", "optimizer": "muon",
                         "tokens": tokens, "reference": "san", "per_seed": per, "mean": m, "spread": 0.0141,
                         "percent": 100 * m / 5.0, "reference_loss": 5.0, "arm_loss": 5.0 + m,
                         "verdict": f"{arm} ahead, {ratio:.0f}× floor",
                         "runs": {str(s): {"reference": run_id("san", tokens, s), "arm": run_id(arm, tokens, s)}
                                  for s in SEEDS}})
    noise = [{"arm": NOISE, "role": "noise", "label": "5L d64, no FFN, rms norm", "optimizer": "muon",
              "tokens": BUDGETS[0], "reference": "san", "per_seed": {"1": FLOOR - 0.001, "2": FLOOR + 0.001},
              "mean": FLOOR, "spread": 0.0014, "percent": 0.08, "reference_loss": 5.0, "arm_loss": 5.0 + FLOOR,
              "size": FLOOR, "runs": {}}]  # F = max(|mean|, sd) (sanlab.study.noise)
    sweep = []
    for arm in ARMS:
        base = 0.02 if arm == "san" else 0.04
        curve = {"0.5": 6.30, "1.0": 6.20, "2.0": 6.18, "4.0": 6.185} if arm == "san" else {
            "0.5": 6.12, "1.0": 6.05, "2.0": 6.09}
        curve = {m: v - 0.1 * ARMS.index(arm) for m, v in curve.items()}
        best = min(curve, key=lambda m: curve[m])
        sweep.append({"arm": arm, "optimizer": "muon", "base_lr": base, "losses": curve, "best": float(best),
                      "done": True, "at_edge": False, "lock": round(base * float(best), 6)})
    arms = [{"name": a, "role": ROLES[a], "kind": "san" if a == "san" else "standard",
             "label": f"{LAYERS[a]}L d64" + (", no FFN" if a == "san" else ", d_ff 256"), "params_total": SIZES[a] + 65_000,
             "params_non_embedding": SIZES[a], "flops_per_token": 1.3e6, "mismatch": None if a == "san" else 0.0}
            for a in ARMS]
    return {"gaps": gaps, "noise_floor": noise, "sweep": sweep, "arms": arms,
            "locks": [{"arm": r["arm"], "optimizer": "muon", "lr": r["lock"]} for r in sweep],
            "throughput": {a: 20_000.0 for a in ARMS},
            "titles": {"gap": "Gap to the reference (san: 5L d64, no FFN) — Δ = arm − san validation loss, nats",
                       "sweep": "LR sweep: validation loss at 120K tokens, seed 1 (best in bold)"},
            "sweep_warnings": []}


def study(tmp_path: Path, seeds: tuple[int, ...] = SEEDS) -> StudyData:
    """The study (every final run of `seeds` analysed at the largest budget)."""
    records: dict[str, dict[str, Any]] = {}
    curves: dict[str, Curve] = {}
    for arm in (*ARMS, NOISE):
        for tokens in BUDGETS if arm != NOISE else BUDGETS[:1]:
            for seed in SEEDS:
                rid = run_id(arm, tokens, seed)
                phases = ["noise"] if arm == NOISE else (["final", "noise"] if arm == "san" and tokens == BUDGETS[0]
                                                         else ["final"])
                loss = 5.0 + (gap_mean(arm, tokens) if arm in GROUP_BASE else (FLOOR if arm == NOISE else 0.0))
                records[rid] = {"run_id": rid, "arm": arm, "phases": phases, "tokens": tokens, "seed": seed,
                                "optimizer": "muon", "status": "completed", "final": {"val_loss": loss}}
                curves[rid] = _curve(loss, tokens // 2048, 25)
        for m in (0.5, 1.0, 2.0):
            rid = f"{arm}-sweep-{m}"
            if arm != NOISE:
                records[rid] = {"run_id": rid, "arm": arm, "phases": ["sweep"], "tokens": 120_000, "seed": 1,
                                "optimizer": "muon", "multiplier": m, "status": "completed",
                                "final": {"val_loss": 6.1}}
                curves[rid] = _curve(6.1, 58, 25)
    spec = {"name": "synthetic", "seeds": list(SEEDS), "final": {"tokens": list(BUDGETS)},
            "sweep": {"enabled": True, "tokens": 120_000}, "noise": {"enabled": True}}
    return StudyData(tmp_path, spec, records, [], tables(), None, curves, {}, analyses(seeds))
