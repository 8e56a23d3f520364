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
    DataPoint,
    StudyArm,
    cell_decision,
    cells,
    noise_arm,
    round_lr,
    run_id,
    sweep_point,
    sweep_results,
)
from sanlab.config import format_tokens
from sanlab.study import noise
from sanlab.study.spec import StudySpec
from sanlab.tables import Cell, Output, Table

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
    data: str = ""  # the data point's slug ("" without a data axis)
    data_value: Any = None  # its axis value

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
                "arm_per_seed": {str(k): v for k, v in self.arm_per_seed.items()},
                "data": self.data, "data_value": self.data_value}


def _pair(ref: StudyArm, arm: StudyArm, opt: str, tokens: int, seeds: list[int],
          lr_ref: float, lr_arm: float, records: Mapping[str, dict], role: str,
          point: DataPoint | None = None) -> Gap:
    """Gap of `arm` against `ref` over the seeds where both finished (at one data point)."""
    slug = point.slug if point is not None else ""
    gap = Gap(arm.name, role, arm.label, opt, tokens, ref.name, data=slug,
              data_value=point.value if point is not None else None)
    lr_all, la_all = [], []
    for seed in seeds:
        lr_ = _loss(records, run_id(ref, opt, lr_ref, tokens, seed, slug))
        la = _loss(records, run_id(arm, opt, lr_arm, tokens, seed, slug))
        if lr_ is not None and la is not None:
            gap.per_seed[seed] = la - lr_
            gap.ref_per_seed[seed], gap.arm_per_seed[seed] = lr_, la
            lr_all.append(lr_)
            la_all.append(la)
    if lr_all:
        gap.ref_loss, gap.arm_loss = statistics.fmean(lr_all), statistics.fmean(la_all)
    return gap


def locks(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
          attempted: set[str], data: str = "") -> dict[tuple[str, str], float]:
    """The locked LR of every cell whose sweep is done (the base LR when the sweep is off),
    from the sweep at the data point whose slug is `data`.

    `attempted`: failed runs in it count as bad sweep points; others as not yet run.
    Tables pass every stored run (what the last `study run` decided on).
    """
    out: dict[tuple[str, str], float] = {}
    for arm, opt in cells(spec, arms):
        base = arm.base_lr_for(spec, opt)
        if not spec.sweep.enabled:
            out[(arm.name, opt)] = round_lr(base)
            continue
        d = cell_decision(spec, sweep_results(spec, arm, opt, records, attempted, data))
        if d.done and d.best is not None:
            out[(arm.name, opt)] = round_lr(base * d.best)
    return out


def locks_by_point(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
                   attempted: set[str], points: list[DataPoint]) -> dict[str, dict[tuple[str, str], float]]:
    """Data slug -> the locks every data point (of `points`, `data_points`) trains at: its
    own sweep's, or those of `sweep.lock_at`'s value (shared, not copied: one sweep decides them)."""
    swept: dict[str, dict[tuple[str, str], float]] = {}
    out = {}
    for p in points:
        src = sweep_point(spec, points, p).slug
        if src not in swept:
            swept[src] = locks(spec, arms, records, attempted, src)
        out[p.slug] = swept[src]
    return out


def gaps(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
         lock: Mapping[tuple[str, str], float],
         point: DataPoint | None = None) -> tuple[list[Gap], list[Gap]]:
    """(gaps of every arm vs the reference, noise-floor pairs) from stored results, at one
    data point (`point`; None: the study's one corpus)."""
    ref = arms[0]
    out: list[Gap] = []
    for arm in arms[1:]:
        for opt in spec.optimizers:
            if (ref.name, opt) not in lock or (arm.name, opt) not in lock:
                continue
            for tokens in spec.final.tokens:
                out.append(_pair(ref, arm, opt, tokens, spec.seeds, lock[(ref.name, opt)],
                                 lock[(arm.name, opt)], records, arm.role, point))
    noise: list[Gap] = []
    opt = spec.noise_optimizer
    if spec.noise.enabled and (ref.name, opt) in lock:
        lr = lock[(ref.name, opt)]
        noise.append(_pair(ref, noise_arm(spec), opt, spec.noise_tokens, spec.noise_seeds,
                           lr, lr, records, "noise", point))
    return out, noise


def all_gaps(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
             points: list[DataPoint]) -> tuple[list[Gap], list[Gap]]:
    """`gaps` at every data point, points in axis order (each with its own noise pair)."""
    by_point = locks_by_point(spec, arms, records, set(records), points)
    rows: list[Gap] = []
    noise_rows: list[Gap] = []
    for p in points:
        point = p if p.slug else None
        r, n = gaps(spec, arms, records, by_point[p.slug], point)
        rows += r
        noise_rows += n
    return rows, noise_rows


def _f(v: float | None, fmt: str = "{:+.4f}") -> str:
    return MISSING if v is None else fmt.format(v)


NO_NOISE = "no noise estimate"


def verdict(g: Gap, floor: Gap | None) -> str:
    """The gap read by the noise rule (`sanlab.study.noise`). Before there is a floor, the
    seed-to-seed spread is the only estimate of the noise: with one seed pair there is
    none, and the sign of the gap says nothing about which arm is ahead."""
    if g.mean is None:
        return MISSING
    favours = g.arm if g.mean < 0 else g.reference
    size = None if floor is None else noise.floor_size(floor.per_seed.values())
    if size is None:
        if len(g.per_seed) < 2:
            return NO_NOISE
        if noise.sign(g.per_seed.values(), 0.0) == 0:
            return "within the seed spread (no floor yet)"
        return f"{favours} ahead beyond the seed spread (no floor yet)"
    if noise.sign(g.per_seed.values(), size) == 0:
        return "within noise"
    return f"{favours} ahead, {abs(g.mean) / max(size, 1e-12):.0f}× floor"


def floors_by_point(noise_rows: list[Gap]) -> dict[str, Gap]:
    """Data slug -> the noise-floor pair every gap at that data point is read against."""
    out: dict[str, Gap] = {}
    for n in noise_rows:
        out.setdefault(n.data, n)
    return out


def _num(v: float | None, fmt: str = "{:+.4f}") -> Cell:
    """A number shown rounded, held whole."""
    return Cell(_f(v, fmt), v)


def _tokens(n: int) -> Cell:
    return Cell(format_tokens(n), n)


def _mean_sd(mean: float | None, sd: float | None, mark: str = "") -> Cell:
    """"−0.3144 ± 0.0104" shown; mean and sd apart as data."""
    text = MISSING if mean is None else noise.nats(mean) + ("" if sd is None else f" ± {noise.nats(sd, False)}") + mark
    return Cell(text, fields={"mean": mean, "sd": sd})


def _delta_cells(g: Gap, seeds: list[int]) -> tuple[Cell, Cell]:
    """The gap's Δ per seed (one field per seed of the study) and its mean ± sd."""
    per = " ".join(noise.nats(v) for v in g.per_seed.values()) or MISSING
    return Cell(per, fields={f"s{s}": g.per_seed.get(s) for s in seeds}), _mean_sd(g.mean, g.spread)


def gap_table(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
              lock: Mapping[tuple[str, str], float], points: list[DataPoint]) -> Table:
    """The gap table; with a data axis, every data point's gaps (`lock` is then unused:
    each point reads its own locks, `locks_by_point`) with a column for the axis value,
    each read against its own point's noise floor."""
    axis = spec.data.axis_key
    rows, noise = all_gaps(spec, arms, records, points) if axis else gaps(spec, arms, records, lock)
    floors = floors_by_point(noise)
    ref = arms[0]
    seeds = ", ".join(f"s{s}" for s in spec.seeds)
    table = Table(f"Gap to the reference ({ref.name}: {ref.label}) — Δ = arm − {ref.name} "
                  f"validation loss, nats; Δ < 0: the arm is ahead (seed pairs {seeds})")
    cols = (([(axis, "right")] if axis else [])
            + [("arm", "left"), ("config", "left"), ("opt", "left"), ("tokens", "right"),
               (f"{ref.name} loss", "right"), ("arm loss", "right"), ("Δ per seed", "right"),
               ("Δ mean ± sd", "right"), ("Δ %", "right"), ("vs noise floor", "left")])
    spare = {"config": 4, "Δ per seed": 3, f"{ref.name} loss": 2, "arm loss": 2, "opt": 1}  # on a narrow terminal
    fields = {"Δ per seed": "Δ", "Δ mean ± sd": "Δ"}  # csv / json: Δ s1, Δ s2, Δ mean, Δ sd
    for col, j in cols:
        table.column(col, j, spare=spare.get(col, 0), field=fields.get(col))  # type: ignore[arg-type]
    lead = (lambda g: [str(g.data_value)]) if axis else (lambda g: [])
    last = None
    for g in rows:
        if axis and last is not None and g.data != last:
            table.add_section()
        last = g.data
        table.add_row(*lead(g), f"{g.arm} ({g.role})", g.label, g.optimizer, _tokens(g.tokens),
                      _num(g.ref_loss, "{:.4f}"), _num(g.arm_loss, "{:.4f}"), *_delta_cells(g, spec.seeds),
                      _num(g.percent, "{:+.2f}%"), verdict(g, floors.get(g.data)))
    if floors:
        table.add_section()
    for floor in floors.values():
        table.add_row(*lead(floor), f"noise floor ({floor.arm} − {ref.name})", floor.label, floor.optimizer,
                      _tokens(floor.tokens), _num(floor.ref_loss, "{:.4f}"), _num(floor.arm_loss, "{:.4f}"),
                      *_delta_cells(floor, spec.noise_seeds), _num(floor.percent, "{:+.2f}%"), "")
    return table


def axis_rows(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
              points: list[DataPoint]) -> list[dict[str, Any]]:
    """The data axis as data: per arm × optimizer × budget, Δ at every axis value
    (mean, sd and per seed, and the verdict against that value's own noise floor)."""
    rows, noise_rows = all_gaps(spec, arms, records, points)
    floors = floors_by_point(noise_rows)
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for g in rows:
        row = out.setdefault((g.arm, g.optimizer, g.tokens), {
            "arm": g.arm, "role": g.role, "label": g.label, "optimizer": g.optimizer, "tokens": g.tokens,
            "values": []})
        floor = floors.get(g.data)
        row["values"].append({"data": g.data, "data_value": g.data_value, "mean": g.mean, "spread": g.spread,
                              "per_seed": {str(k): v for k, v in g.per_seed.items()},
                              "noise_size": None if floor is None else noise.floor_size(floor.per_seed.values()),
                              "verdict": verdict(g, floor)})
    return list(out.values())


def sweep_note(spec: StudySpec) -> str:
    """How a data axis's LRs were locked, for the axis table's title."""
    if not spec.sweep.enabled:
        return "no sweep: every arm at its base LR"
    if spec.sweep.lock_at is not None:
        return f"LRs locked once at {spec.data.axis_key}={spec.sweep.lock_at} and reused at every value"
    return "each value with its own sweep"


def axis_table(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
               points: list[DataPoint]) -> Table:
    """Δ per arm against the data knob: one column per value, mean ± sd over seed pairs."""
    key = spec.data.axis_key
    ref = arms[0]
    table = Table(f"Δ = arm − {ref.name} against {key} (mean ± sd over seed pairs; * beyond that "
                  f"value's noise floor); {sweep_note(spec)}")
    table.column("arm")
    table.column("opt")
    table.column("tokens", "right")
    for v in spec.data.axis_values:
        table.column(f"{key}={v}", "right")
    for row in axis_rows(spec, arms, records, points):
        by = {str(c["data_value"]): c for c in row["values"]}
        cells_ = []
        for v in spec.data.axis_values:
            c = by.get(str(v))
            if c is None or c["mean"] is None:
                cells_.append(Cell(MISSING, fields={"mean": None, "sd": None, "beyond noise": None}))
                continue
            beyond = "× floor" in c["verdict"]  # beyond this value's noise floor
            cell = _mean_sd(c["mean"], c["spread"], "*" if beyond else "")
            cells_.append(Cell(cell.text, fields={**(cell.fields or {}), "beyond noise": beyond}))
        table.add_row(f"{row['arm']} ({row['role']})", row["optimizer"], _tokens(row["tokens"]), *cells_)
    return table


def data_rows(spec: StudySpec, arms: list[StudyArm],
              data_info: Mapping[str, dict[str, Any]], points: list[DataPoint]) -> list[dict[str, Any]]:
    """Per data point × arm: the world's facts and bits (from `sanlab prepare`'s floor file,
    kept in the store's `data` records) per non-embedding parameter of the arm."""
    out = []
    for p in points:
        info = data_info.get(p.slug)
        if info is None:
            continue
        world = info.get("world") or {}
        facts, bits = world.get("facts"), world.get("bits")
        for a in arms:
            n = a.params_non_embedding
            out.append({"data": p.slug, "data_value": p.value, "arm": a.name, "role": a.role,
                        "params_non_embedding": n, "facts": facts, "bits": bits,
                        "bits_per_fact": world.get("bits_per_fact"),
                        "facts_per_param": facts / n if facts is not None and n else None,
                        "bits_per_param": bits / n if bits is not None and n else None,
                        "train_tokens": info.get("train_tokens"),
                        "entropy_floor": (info.get("floor") or {}).get("val")})
    return out


def data_table(spec: StudySpec, arms: list[StudyArm], data_info: Mapping[str, dict[str, Any]],
               points: list[DataPoint]) -> Table | None:
    """The corpora and what each arm must store of them: facts and bits of information
    (facts × bits per fact, the generator's own distributions) per non-embedding parameter."""
    rows = data_rows(spec, arms, data_info, points)
    if not rows:
        return None
    key = spec.data.axis_key
    table = Table("Data: the world's facts and bits of information per non-embedding parameter of each arm "
                  "(bits: facts × bits per fact, from the generator's distributions)")
    if key:
        table.column(key, "right")
    spare = {"train tokens": 3, "entropy floor (val)": 3, "bits/fact": 2, "facts": 1, "bits": 1}  # narrow terminal
    for col in ("arm", "non-emb params", "train tokens", "entropy floor (val)", "facts", "bits",
                "bits/fact", "facts/param", "bits/param"):
        table.column(col, "left" if col == "arm" else "right", spare=spare.get(col, 0))
    last = None
    for r in rows:
        if key and last is not None and r["data"] != last:
            table.add_section()
        last = r["data"]
        table.add_row(*([str(r["data_value"])] if key else []), f"{r['arm']} ({r['role']})",
                      f"{r['params_non_embedding']:,}",
                      MISSING if r["train_tokens"] is None else _tokens(r["train_tokens"]),
                      _num(r["entropy_floor"], "{:.4f}"),
                      MISSING if r["facts"] is None else f"{r['facts']:,}",
                      _num(r["bits"], "{:,.0f}"), _num(r["bits_per_fact"], "{:.2f}"),
                      _num(r["facts_per_param"], "{:.4f}"), _num(r["bits_per_param"], "{:.4f}"))
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
    data: str = ""  # the data point's slug ("" without a data axis)

    @property
    def lock(self) -> float | None:
        return round_lr(self.base_lr * self.best) if self.best is not None and self.done else None

    @property
    def margin(self) -> float | None:
        """By how much the lock beats the runner-up: the second-lowest finished loss minus
        the lowest (nats; None before the lock, or with one finished point)."""
        finite = sorted(v for v in self.losses.values() if v is not None)
        return finite[1] - finite[0] if self.lock is not None and len(finite) >= 2 else None

    def runner_up(self) -> float | None:
        """The multiplier of the second-lowest finished loss (None where `margin` is)."""
        if self.margin is None:
            return None
        return sorted((v, m) for m, v in self.losses.items() if v is not None)[1][1]

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "optimizer": self.optimizer, "base_lr": self.base_lr,
                "losses": {str(k): v for k, v in self.losses.items()}, "best": self.best,
                "done": self.done, "at_edge": self.at_edge, "lock": self.lock, "margin": self.margin,
                "data": self.data}


def sweep_rows(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
               data: str = "") -> list[SweepRow]:
    rows = []
    for arm, opt in cells(spec, arms):
        results = sweep_results(spec, arm, opt, records, set(records), data)
        d = cell_decision(spec, results)
        rows.append(SweepRow(arm.name, opt, arm.base_lr_for(spec, opt), results, d.best,
                             d.done, d.at_edge and d.done and d.best is not None, data))
    return rows


def swept_points(spec: StudySpec, points: list[DataPoint]) -> list[DataPoint]:
    """The data points that run a sweep: the one corpus, every axis value, or `sweep.lock_at`'s."""
    return [p for p in points if sweep_point(spec, points, p) == p]


def sweep_floors(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
                 points: list[DataPoint]) -> dict[str, float]:
    """Data slug -> the size F of the noise floor measured there (`noise.floor_size`; only
    the points whose floor pair has a finished seed), which each sweep's lock margin is read
    against (`sweep_table`)."""
    _, noise_rows = all_gaps(spec, arms, records, points)
    out = {}
    for slug, g in floors_by_point(noise_rows).items():
        size = noise.floor_size(g.per_seed.values())
        if size is not None:
            out[slug] = size
    return out


def unresolved_lock(r: SweepRow, floor: float | None) -> bool:
    """Whether the lock beats the runner-up LR by no more than the noise floor F (the one
    noise rule, `noise.sign`, on one value: the sweep trains one seed): the sweep does not
    tell the two LRs apart, so which one the final runs train at was decided by noise."""
    return floor is not None and r.margin is not None and noise.sign([r.margin], floor) == 0


def sweep_table(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict],
                point: DataPoint | None = None, floor: float | None = None) -> tuple[Table, list[str]]:
    """SPEC §1.4's layout: multipliers as columns, best in bold, the locked LR; plus warnings:
    a lock still at an edge of the sweep, and a lock that wins by no more than the noise
    floor `floor` (F, nats, where the study has measured one: `sweep_floors`)."""
    data = point.slug if point is not None else ""
    rows = sweep_rows(spec, arms, records, data)
    mults = sorted(set(spec.sweep.multipliers).union(*(r.losses.keys() for r in rows)))
    at = ""
    if point is not None and point.key is not None:
        at = f" at {point.label}" + (" (locks reused at every value)" if spec.sweep.lock_at is not None else "")
    table = Table(f"LR sweep{at}: validation loss at {format_tokens(spec.sweep.tokens)} tokens, "
                  f"seed {spec.sweep_seed} (best in bold; * in plain text)")
    table.column("arm × optimizer")
    table.column("base LR", "right")
    for m in mults:
        table.column(f"{m:g}×", "right", flagged=True)  # csv / json: `2× best`, the locked multiplier
    table.column("lock", "right")  # csv / json: lock lr, lock at edge
    warnings = []
    for r in rows:
        cells_ = []
        best = []
        for k, m in enumerate(mults):
            if m not in r.losses:
                cells_.append("" if m not in spec.sweep.multipliers or r.done else MISSING)
            elif r.losses[m] is None:
                cells_.append(Cell("div/fail", None))  # no loss to hold
            else:
                cells_.append(_num(r.losses[m], "{:.4f}"))
                if m == r.best:
                    best.append(2 + k)
        lock = Cell(MISSING if r.lock is None else f"{r.lock:g}" + (" (edge!)" if r.at_edge else ""),
                    fields={"lr": r.lock, "at edge": r.at_edge if r.lock is not None else None})
        table.add_row(f"{r.arm} {r.optimizer}", f"{r.base_lr:g}", *cells_, lock, bold=best)
        if r.at_edge:
            warnings.append(f"warning: {r.arm} {r.optimizer}{at.split(' (')[0]}: best LR {r.lock:g} is still at an edge "
                            "of the sweep (extension off or limit reached); the optimum may lie beyond")
        if unresolved_lock(r, floor):
            warnings.append(f"warning: {r.arm} {r.optimizer}{at.split(' (')[0]}: lock {r.lock:g} beats "
                            f"{round_lr(r.base_lr * r.runner_up()):g} by {noise.nats(r.margin, False)} nats, within the noise "
                            f"floor (F = {noise.nats(floor, False)}): at {format_tokens(spec.sweep.tokens)} tokens the sweep does not tell "
                            "the two apart, so noise chose the final runs' LR (a longer sweep.tokens may separate them)")
    return table, warnings


def throughput(records: Mapping[str, dict]) -> dict[str, float]:
    """Measured training tokens/s per arm (mean over its finished runs): what sizes
    `runner.tokens_per_s` for the next plan. A run trained as one of M members of a group
    (`members` in its record) counts as its group's tokens/s, M × its own: what one
    process trained, as a solo run's figure is."""
    per: dict[str, list[float]] = {}
    for r in records.values():
        if r.get("tokens_per_s"):
            m = r.get("members")
            per.setdefault(r["arm"], []).append(float(r["tokens_per_s"]) * (m if isinstance(m, int) and m > 1 else 1))
    return {arm: statistics.fmean(v) for arm, v in per.items()}


def print_tables(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict], points: list[DataPoint],
                 out: Output, data_info: Mapping[str, dict[str, Any]] | None = None) -> None:
    """The sweep table (with its warnings; one per swept data point), the gap table, with
    a data axis the Δ-against-the-axis table, the data table (facts and bits per
    parameter, where the store holds the prepared data's world) and the measured throughput."""
    lock = locks(spec, arms, records, set(records))
    if spec.sweep.enabled:
        floors = sweep_floors(spec, arms, records, points)
        for p in swept_points(spec, points):
            table, warnings = sweep_table(spec, arms, records, p if p.slug else None, floors.get(p.slug))
            out.table(table)
            for w in warnings:
                out.note(w, style="yellow")
    out.table(gap_table(spec, arms, records, lock, points))
    if spec.data.axis:
        out.table(axis_table(spec, arms, records, points))
    dt = data_table(spec, arms, data_info or {}, points)
    if dt is not None:
        out.table(dt)
    tps = throughput(records)
    if tps:
        out.note("measured throughput (training tokens/s per process: a run, or a group of members in total): "
                 + ", ".join(f"{a.name} {tps[a.name]:,.0f}" for a in arms if a.name in tps))
