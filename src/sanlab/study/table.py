"""The study's answer as tables: the gap table and the LR sweep table (SPEC §1.4, §1.6).

Both are computed from the spec and the results store alone, so they can be printed at
any time, also while a study is still running (missing cells show as "—"). They are
`sanlab.tables.Table`s, printed in any of the formats of `sanlab.tables`.

Gap: Δ = arm − reference validation loss (nats; negative = the arm is ahead of the
reference), per seed pair (the same seed in both arms) and as mean ± spread (sample
standard deviation over seed pairs), and as % of the reference's loss. With the SAN as
reference this is the paper's "standard − SAN". The noise floor is the gap between the
two halves of the control pair (rms − zcrms norm, same seeds); a gap is "within noise"
by the study's one noise rule (`sanlab.study.noise`): its |mean| is not above the floor's
size F plus the gap's own seed-to-seed spread.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from sanlab.study.plan import (
    StudyArm,
    cell_decision,
    cells,
    noise_arm,
    round_lr,
    run_id,
    sweep_results,
)
from sanlab.config import format_tokens
from sanlab.study import noise
from sanlab.study.spec import StudySpec
from sanlab.tables import Output, Table

MISSING = "—"  # a cell whose run has not finished (or cannot exist yet)


def _loss(records: Mapping[str, dict], run_id: str) -> float | None:
    rec = records.get(run_id)
    if rec is None or rec.get("status") != "completed":
        return None
    v = (rec.get("final") or {}).get("val_loss")
    return float(v) if v is not None and math.isfinite(v) else None


@dataclass
class Gap:
    """One arm vs the reference at one optimizer and budget: Δ = arm − reference."""

    arm: str
    role: str
    label: str
    optimizer: str
    tokens: int
    reference: str = ""
    per_seed: dict[int, float] = field(default_factory=dict)  # seed -> Δ (arm − reference)
    ref_loss: float | None = None  # mean over paired seeds
    arm_loss: float | None = None
    ref_per_seed: dict[int, float] = field(default_factory=dict)  # seed -> loss, the paired seeds
    arm_per_seed: dict[int, float] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        return noise.mean_spread(self.per_seed.values())[0]

    @property
    def spread(self) -> float | None:
        return noise.mean_spread(self.per_seed.values())[1]

    @property
    def percent(self) -> float | None:
        return None if self.mean is None or not self.ref_loss else 100 * self.mean / self.ref_loss

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "role": self.role, "label": self.label, "optimizer": self.optimizer,
                "tokens": self.tokens, "reference": self.reference, "delta": "arm - reference",
                "per_seed": {str(k): v for k, v in self.per_seed.items()},
                "mean": self.mean, "spread": self.spread, "percent": self.percent,
                "reference_loss": self.ref_loss, "arm_loss": self.arm_loss,
                "reference_per_seed": {str(k): v for k, v in self.ref_per_seed.items()},
                "arm_per_seed": {str(k): v for k, v in self.arm_per_seed.items()}}


def _pair(ref: StudyArm, arm: StudyArm, opt: str, tokens: int, seeds: list[int],
          lr_ref: float, lr_arm: float, records: Mapping[str, dict], role: str) -> Gap:
    """Gap of `arm` against `ref` over the seeds where both finished."""
    gap = Gap(arm.name, role, arm.label, opt, tokens, ref.name)
    lr_all, la_all = [], []
    for seed in seeds:
        lr_ = _loss(records, run_id(ref, opt, lr_ref, tokens, seed))
        la = _loss(records, run_id(arm, opt, lr_arm, tokens, seed))
        if lr_ is not None and la is not None:
            gap.per_seed[seed] = la - lr_
            gap.ref_per_seed[seed], gap.arm_per_seed[seed] = lr_, la
            lr_all.append(lr_)
            la_all.append(la)
    if lr_all:
        gap.ref_loss, gap.arm_loss = statistics.fmean(lr_all), statistics.fmean(la_all)
    return gap


def locks(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
          attempted: set[str]) -> dict[tuple[str, str], float]:
    """The locked LR of every cell whose sweep is done (the base LR when the sweep is off).

    `attempted`: failed runs in it count as bad sweep points; others as not yet run.
    Tables pass every stored run (what the last `study run` decided on).
    """
    out: dict[tuple[str, str], float] = {}
    for arm, opt in cells(spec, arms):
        base = arm.base_lr_for(spec, opt)
        if not spec.sweep.enabled:
            out[(arm.name, opt)] = round_lr(base)
            continue
        d = cell_decision(spec, sweep_results(spec, arm, opt, records, attempted))
        if d.done and d.best is not None:
            out[(arm.name, opt)] = round_lr(base * d.best)
    return out


def gaps(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
         lock: Mapping[tuple[str, str], float]) -> tuple[list[Gap], list[Gap]]:
    """(gaps of every arm vs the reference, noise-floor pairs) from stored results."""
    ref = arms[0]
    out: list[Gap] = []
    for arm in arms[1:]:
        for opt in spec.optimizers:
            if (ref.name, opt) not in lock or (arm.name, opt) not in lock:
                continue
            for tokens in spec.final.tokens:
                out.append(_pair(ref, arm, opt, tokens, spec.seeds, lock[(ref.name, opt)],
                                 lock[(arm.name, opt)], records, arm.role))
    noise: list[Gap] = []
    opt = spec.noise_optimizer
    if spec.noise.enabled and (ref.name, opt) in lock:
        lr = lock[(ref.name, opt)]
        noise.append(_pair(ref, noise_arm(spec), opt, spec.noise_tokens, spec.noise_seeds,
                           lr, lr, records, "noise"))
    return out, noise


def _f(v: float | None, fmt: str = "{:+.4f}") -> str:
    return MISSING if v is None else fmt.format(v)


def verdict(g: Gap, floor: Gap | None) -> str:
    if g.mean is None:
        return MISSING
    favours = g.arm if g.mean < 0 else g.reference
    size = None if floor is None else noise.floor_size(floor.per_seed.values())
    if size is None:
        return f"{favours} ahead (no floor yet)"
    if noise.sign(g.per_seed.values(), size) == 0:
        return "within noise"
    return f"{favours} ahead, {abs(g.mean) / max(size, 1e-12):.0f}× floor"


def gap_table(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
              lock: Mapping[tuple[str, str], float]) -> Table:
    rows, noise = gaps(spec, arms, records, lock)
    floor = noise[0] if noise else None
    ref = arms[0]
    seeds = ", ".join(f"s{s}" for s in spec.seeds)
    table = Table(f"Gap to the reference ({ref.name}: {ref.label}) — Δ = arm − {ref.name} "
                  f"validation loss, nats; Δ < 0: the arm is ahead (seed pairs {seeds})")
    for col, j in (("arm", "left"), ("config", "left"), ("opt", "left"), ("tokens", "right"),
                   (f"{ref.name} loss", "right"), ("arm loss", "right"), ("Δ per seed", "right"),
                   ("Δ mean ± sd", "right"), ("Δ %", "right"), ("vs noise floor", "left")):
        table.column(col, j)  # type: ignore[arg-type]
    for g in rows:
        per = " ".join(f"{v:+.4f}" for v in g.per_seed.values()) or MISSING
        ms = MISSING if g.mean is None else _f(g.mean) + ("" if g.spread is None else f" ± {g.spread:.4f}")
        table.add_row(f"{g.arm} ({g.role})", g.label, g.optimizer, format_tokens(g.tokens),
                      _f(g.ref_loss, "{:.4f}"), _f(g.arm_loss, "{:.4f}"), per, ms,
                      _f(g.percent, "{:+.2f}%"), verdict(g, floor))
    if floor is not None:
        per = " ".join(f"{v:+.4f}" for v in floor.per_seed.values()) or MISSING
        ms = MISSING if floor.mean is None else _f(floor.mean) + (
            "" if floor.spread is None else f" ± {floor.spread:.4f}")
        table.add_section()
        table.add_row(f"noise floor ({floor.arm} − {ref.name})", floor.label, floor.optimizer,
                      format_tokens(floor.tokens), _f(floor.ref_loss, "{:.4f}"),
                      _f(floor.arm_loss, "{:.4f}"), per, ms, _f(floor.percent, "{:+.2f}%"), "")
    return table


@dataclass
class SweepRow:
    arm: str
    optimizer: str
    base_lr: float
    losses: dict[float, float | None]  # multiplier -> loss (None: diverged / failed)
    best: float | None
    done: bool
    at_edge: bool

    @property
    def lock(self) -> float | None:
        return round_lr(self.base_lr * self.best) if self.best is not None and self.done else None

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "optimizer": self.optimizer, "base_lr": self.base_lr,
                "losses": {str(k): v for k, v in self.losses.items()}, "best": self.best,
                "done": self.done, "at_edge": self.at_edge, "lock": self.lock}


def sweep_rows(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict]) -> list[SweepRow]:
    rows = []
    for arm, opt in cells(spec, arms):
        results = sweep_results(spec, arm, opt, records, set(records))
        d = cell_decision(spec, results)
        rows.append(SweepRow(arm.name, opt, arm.base_lr_for(spec, opt), results, d.best,
                             d.done, d.at_edge and d.done and d.best is not None))
    return rows


def sweep_table(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict]) -> tuple[Table, list[str]]:
    """SPEC §1.4's layout: multipliers as columns, best in bold, the locked LR; plus warnings."""
    rows = sweep_rows(spec, arms, records)
    mults = sorted(set(spec.sweep.multipliers).union(*(r.losses.keys() for r in rows)))
    table = Table(f"LR sweep: validation loss at {format_tokens(spec.sweep.tokens)} tokens, "
                  f"seed {spec.sweep_seed} (best in bold; * in plain text)")
    table.column("arm × optimizer")
    table.column("base LR", "right")
    for m in mults:
        table.column(f"{m:g}×", "right")
    table.column("lock", "right")
    warnings = []
    for r in rows:
        cells_ = []
        best = []
        for k, m in enumerate(mults):
            if m not in r.losses:
                cells_.append("" if m not in spec.sweep.multipliers or r.done else MISSING)
            elif r.losses[m] is None:
                cells_.append("div/fail")
            else:
                cells_.append(f"{r.losses[m]:.4f}")
                if m == r.best:
                    best.append(2 + k)
        lock = MISSING if r.lock is None else f"{r.lock:g}" + (" (edge!)" if r.at_edge else "")
        table.add_row(f"{r.arm} {r.optimizer}", f"{r.base_lr:g}", *cells_, lock, bold=best)
        if r.at_edge:
            warnings.append(f"warning: {r.arm} {r.optimizer}: best LR {r.lock:g} is still at an edge "
                            "of the sweep (extension off or limit reached); the optimum may lie beyond")
    return table, warnings


def throughput(records: Mapping[str, dict]) -> dict[str, float]:
    """Measured training tokens/s per arm (mean over its finished runs): what sizes
    `runner.tokens_per_s` for the next plan."""
    per: dict[str, list[float]] = {}
    for r in records.values():
        if r.get("tokens_per_s"):
            per.setdefault(r["arm"], []).append(float(r["tokens_per_s"]))
    return {arm: statistics.fmean(v) for arm, v in per.items()}


def print_tables(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
                 out: Output) -> None:
    """The sweep table (with its warnings), the gap table and the measured throughput."""
    lock = locks(spec, arms, records, set(records))
    if spec.sweep.enabled:
        table, warnings = sweep_table(spec, arms, records)
        out.table(table)
        for w in warnings:
            out.note(w, style="yellow")
    out.table(gap_table(spec, arms, records, lock))
    tps = throughput(records)
    if tps:
        out.note("measured throughput (training tokens/s per run): "
                 + ", ".join(f"{a.name} {tps[a.name]:,.0f}" for a in arms if a.name in tps))
