"""Expand a study spec into arms and runs (SPEC §1.2–1.4).

Arms: the reference, one standard partner per requested matching (built by the same
solver as `sanlab match`), the explicit `[[arms]]`, and — for the noise floor only —
the reference with its norm swapped (zcrms ↔ rms).

Runs are identified by what they train, `san-L20-d512-muon-lr0.02-5B-s42`
(arm, depth, width, optimizer, LR, tokens, seed), so two phases that ask for the same
training (a sweep point at a final budget, the zcrms half of the noise pair and the
reference's final run) share one run instead of training it twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sanlab.config import Config, ModelConfig, TrainConfig, format_tokens, to_toml_dict, validate
from sanlab.errors import ConfigError
from sanlab.matching import layout_prefix, match, model_label
from sanlab.study.spec import (
    ArmKind,
    DataPoint,
    Optimizer,
    StudySpec,
    reference_name,
)
from sanlab.study.sweep import SweepDecision, decide
from sanlab.study.warm import WARM_START_S
from sanlab.study.warm import enabled as warm_enabled
from sanlab.train.resolve import make_plan  # the trainer's own steps and milestones

MATCH_TARGETS = {"iso_param": "params", "iso_flop": "flops", "iso_depth": "depth"}
# Outcomes that are results; `failed` and `interrupted` are retried by the next `study run`.
FINAL_STATUSES = ("completed", "diverged")


@dataclass(frozen=True)
class StudyArm:
    """One model of the study with its accounting (SPEC §1.2 counting convention)."""

    name: str
    role: str  # reference | iso-param | iso-FLOP | iso-depth | explicit | noise
    model: ModelConfig
    params_total: int
    params_non_embedding: int
    flops_per_token: int  # training FLOPs per token (3 × forward)
    mismatch: float | None = None  # signed relative mismatch in the matched quantity
    train: Mapping[str, Any] = field(default_factory=dict)  # train keys this arm replaces (freeze, …)
    base_lr: Mapping[str, float] = field(default_factory=dict)  # optimizer -> this arm's own base LR

    @property
    def kind(self) -> ArmKind:
        return "ffn" if self.model.ffn else "san"

    @property
    def label(self) -> str:
        return arm_label(self.model, self.train)

    def base_lr_for(self, spec: StudySpec, optimizer: str) -> float:
        """The centre of this arm's sweep: its own base LR, else the spec's by kind."""
        if optimizer in self.base_lr:
            return float(self.base_lr[optimizer])
        return spec.sweep.base_lr.get(self.kind, optimizer)  # type: ignore[arg-type]


def arm_label(model: ModelConfig, train: Mapping[str, Any] | None = None) -> str:
    """The model's shape label plus any training switch that changes the architecture
    actually trained (a freeze)."""
    freeze = (train or {}).get("freeze")
    label = model_label(model)
    return f"{label}, frozen {'+'.join(freeze)}" if freeze else label


def arm_tag(model: ModelConfig, train: Mapping[str, Any] | None = None) -> str:
    """A run-id fragment naming a non-default mixer / layout (`sanlab.matching.layout_prefix`)
    and a freeze ('' for the softmax arms, whose run ids stay as they were)."""
    parts = [layout_prefix(model)]
    freeze = (train or {}).get("freeze")
    if freeze:
        parts.append("frz" + "".join(sorted(freeze)))
    return "-".join(p for p in parts if p)


@dataclass
class PlannedRun:
    """One training run of the study."""

    run_id: str
    arm: str
    kind: ArmKind
    optimizer: Optimizer
    phases: list[str]  # sweep | final | noise (several when phases share the run)
    multiplier: float | None  # LR multiplier of the arm's base LR (sweep points)
    lr: float
    seed: int
    tokens: int
    config: Config
    params_total: int
    params_non_embedding: int
    flops_per_token: int
    note: str = ""
    data: str = ""  # the data point's slug ("" without a data axis)
    data_value: Any = None  # its axis value

    @property
    def phase(self) -> str:
        return "+".join(self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "arm": self.arm, "kind": self.kind, "optimizer": self.optimizer,
            "phases": list(self.phases), "multiplier": self.multiplier, "lr": self.lr,
            "seed": self.seed, "tokens": self.tokens, "params_total": self.params_total,
            "params_non_embedding": self.params_non_embedding,
            "flops_per_token": self.flops_per_token, "note": self.note,
            "data": self.data, "data_value": self.data_value,
            "config": to_toml_dict(self.config),
        }


# --------------------------------------------------------------------------- arms


def _study_arm(name: str, role: str, model: ModelConfig, seq_len: int, causal_half: bool,
               mismatch: float | None = None, **extra: Any) -> StudyArm:
    # One reference-only call of the solver gives the accounting of any single model.
    (a,) = match(model, seq_len, targets=(), causal_half=causal_half)
    return StudyArm(name, role, model, a.params.total, a.params.non_embedding, a.flops.train, mismatch,
                    **extra)


def build_arms(spec: StudySpec) -> list[StudyArm]:
    """Reference first, then the matched partners in spec order, then explicit arms.

    Raises `MatchingError` (one line) when a partner is impossible or beyond tolerance.
    """
    m, seq_len = spec.matching, spec.data.seq_len
    solved = match(
        spec.model, seq_len,
        targets=[MATCH_TARGETS[a] for a in m.arms],  # type: ignore[misc]
        policy=m.policy, tolerance=m.tolerance, causal_half=m.causal_half, vary=m.vary,
        partner=m.partner,
    )
    ref = solved[0]
    arms = [StudyArm(reference_name(spec), "reference", spec.model, ref.params.total,
                     ref.params.non_embedding, ref.flops.train)]
    for name, a in zip(m.arms, solved[1:]):
        arms.append(StudyArm(name, a.role, a.config, a.params.total, a.params.non_embedding,
                             a.flops.train, a.mismatch))
    for explicit in spec.arms:
        model = validate(ModelConfig, {**spec.model.model_dump(), **explicit.model},
                         source=f"arms.{explicit.name}.model")
        validate(TrainConfig, {**spec.train.model_dump(), **explicit.train}, source=f"arms.{explicit.name}.train")
        arms.append(_study_arm(explicit.name, "explicit", model, seq_len, m.causal_half,
                               train=dict(explicit.train), base_lr=dict(explicit.base_lr)))
    return arms


def noise_arm(spec: StudySpec) -> StudyArm:
    """The reference with its norm swapped: the other half of the noise-floor pair."""
    other = "rms" if spec.model.norm == "zcrms" else "zcrms"
    model = spec.model.model_copy(update={"norm": other})
    return _study_arm(f"{reference_name(spec)}_{other}", "noise", model, spec.data.seq_len,
                      spec.matching.causal_half)


# --------------------------------------------------------------------------- runs


def round_lr(lr: float) -> float:
    """Six significant digits: base × multiplier without float noise in run ids."""
    return float(f"{lr:.6g}")


def run_id(arm: StudyArm, optimizer: str, lr: float, tokens: int, seed: int, data: str = "") -> str:
    """`san-L20-d512-muon-lr0.02-5B-s42`; a variant arm carries its mixer / layout / freeze
    after the name (`nonapprox_h-hyb-nonapprox-L8-d128-…`); a run at a value of a data
    axis starts with the value's slug (`facts400-san-L20-…`, `DataPoint.slug`)."""
    m = arm.model
    tag = arm_tag(m, arm.train)
    # (an arm already named after its variant, `mixit` or `hyb_nonapprox`, is not tagged twice)
    name = f"{arm.name}-{tag}" if tag and not arm.name.replace("_", "-").startswith(tag) else arm.name
    rid = f"{name}-L{m.n_layers}-d{m.d_model}-{optimizer}-lr{lr:g}-{format_tokens(tokens)}-s{seed}"
    return f"{data}-{rid}" if data else rid


# --------------------------------------------------------------------------- the data axis


def data_points(spec: StudySpec, study_dir: str | Path | None) -> list[DataPoint]:
    """The study's corpora in axis order: one without an axis, one per `data.axis` value
    (each with its own prepared dir). Raises `ConfigError` when two values share a slug."""
    base = default_data_dir(spec, study_dir)
    axis = spec.data.typed_axis
    return [DataPoint(None, None, "", base)] if axis is None else axis.points(base)


def sweep_point(spec: StudySpec, points: list[DataPoint], point: DataPoint) -> DataPoint:
    """The data point whose sweep locks `point`'s LRs: itself, or `sweep.lock_at`'s value."""
    if spec.sweep.lock_at is None:
        return point
    return next(p for p in points if repr(p.value) == repr(spec.sweep.lock_at))


def make_run(spec: StudySpec, arm: StudyArm, optimizer: Optimizer, lr: float, seed: int,
             tokens: int, phase: str, data_dir: str, *, multiplier: float | None = None,
             note: str = "", point: "DataPoint | None" = None) -> PlannedRun:
    """One run: the spec's base `optim` / `train` settings with this arm, LR, seed and budget,
    on `data_dir` (the data point `point`'s dir, when the study has a data axis)."""
    data = {"dir": data_dir, "seq_len": spec.data.seq_len}
    cfg = validate(Config, {
        "model": arm.model.model_dump(),
        "data": data,
        "optim": {**spec.optim.model_dump(), "name": optimizer, "lr": lr},
        "train": {**spec.train.model_dump(), **arm.train, "tokens": tokens, "seed": seed, "steps": None},
    }, source=f"run {arm.name}")
    slug = point.slug if point is not None else ""
    return PlannedRun(run_id(arm, optimizer, lr, tokens, seed, slug), arm.name, arm.kind, optimizer,
                      [phase], multiplier, lr, seed, tokens, cfg, arm.params_total,
                      arm.params_non_embedding, arm.flops_per_token, note, slug,
                      point.value if point is not None else None)


def merge(runs: Iterable[PlannedRun]) -> list[PlannedRun]:
    """Merge runs with the same id (same training), keeping every phase that asked for it."""
    out: dict[str, PlannedRun] = {}
    for r in runs:
        if r.run_id in out:
            kept = out[r.run_id]
            if kept.config != r.config:
                raise ConfigError(f"two different runs would share the id {r.run_id}; rename an arm")
            kept.phases.extend(p for p in r.phases if p not in kept.phases)
            kept.multiplier = kept.multiplier if kept.multiplier is not None else r.multiplier
            kept.note = kept.note or r.note
        else:
            out[r.run_id] = r
    return list(out.values())


def makespan(seconds: Iterable[float], workers: int) -> float:
    """Wall time of one batch of jobs on `workers` workers, each taking the longest job left
    when it frees up (the batch waits for its last job)."""
    ends = [0.0] * max(1, workers)
    for t in sorted(seconds, reverse=True):
        ends[ends.index(min(ends))] += t
    return max(ends)


def stream_makespan(units: Sequence[tuple[float, Sequence[PlannedRun]]], workers: int,
                    reference: str = "", noise_optimizer: str = "") -> float:
    """Wall time of a study streamed as the local runner streams it (`Study._stream`):
    `units` are (seconds, runs) of what runs as one (a run, or a group of members). A unit
    of final runs becomes ready when every sweep unit of its cells has finished (its arm ×
    optimizer at its data point, or at any point where only another point sweeps; the
    noise arm's: the reference's cell at `noise_optimizer`); a free worker takes a ready
    sweep unit before a final one, then the longest. Sweep points that boundary extension
    adds are not known here (`StudyPlan.extension_seconds`)."""
    def is_sweep(runs: Sequence[PlannedRun]) -> bool:
        return any("sweep" in r.phases for r in runs)

    sweep_cells: dict[tuple[str, str, str], list[int]] = {}
    for i, (_, runs) in enumerate(units):
        if is_sweep(runs):
            for r in runs:
                sweep_cells.setdefault((r.data, r.arm, r.optimizer), []).append(i)
    swept_arms = {(arm, opt) for _, arm, opt in sweep_cells}
    deps: list[set[int]] = []
    for _, runs in units:
        need: set[int] = set()
        if not is_sweep(runs):
            for r in runs:
                arm, opt = r.arm, r.optimizer
                if (arm, opt) not in swept_arms and "noise" in r.phases:
                    arm, opt = reference, noise_optimizer  # the noise arm trains at the reference's lock
                own = sweep_cells.get((r.data, arm, opt))
                need.update(own if own is not None else
                            [i for (_, a, o), ids in sweep_cells.items() if (a, o) == (arm, opt) for i in ids])
        deps.append(need)
    done: set[int] = set()
    waiting = set(range(len(units)))
    running: list[tuple[float, int]] = []  # (end, unit)
    now = 0.0
    while waiting or running:
        ready = sorted((i for i in waiting if deps[i] <= done),
                       key=lambda i: (not is_sweep(units[i][1]), -units[i][0], i))
        while ready and len(running) < max(1, workers):
            i = ready.pop(0)
            waiting.discard(i)
            running.append((now + units[i][0], i))
        if not running:  # (a unit whose cells have no sweep unit: ready from the start)
            break
        running.sort()
        now, i = running.pop(0)
        done.add(i)
    return now


def cell_key(data: str, arm: str, optimizer: str) -> tuple[str, ...]:
    """A sweep cell's key: (arm, optimizer), with the data slug first on a data axis."""
    return (data, arm, optimizer) if data else (arm, optimizer)


def cells(spec: StudySpec, arms: list[StudyArm]) -> list[tuple[StudyArm, Optimizer]]:
    """The arm × optimizer cells; each gets its own LR sweep and lock."""
    return [(a, o) for a in arms for o in spec.optimizers]


def sweep_results(spec: StudySpec, arm: StudyArm, optimizer: str, records: Mapping[str, dict],
                  attempted: set[str], data: str = "") -> dict[float, float | None]:
    """Multiplier -> val loss of this cell's finished sweep points (at the data point
    whose slug is `data`).

    Diverged points count as infinitely bad (None). Failed or interrupted points count
    so only if this invocation already retried them; otherwise they are re-run.
    """
    out: dict[float, float | None] = {}
    for rid, rec in records.items():
        if (rec.get("arm") != arm.name or rec.get("optimizer") != optimizer
                or (rec.get("data") or "") != data
                or "sweep" not in rec.get("phases", []) or rec.get("multiplier") is None
                or rec.get("tokens") != spec.sweep.tokens or rec.get("seed") != spec.sweep_seed):
            continue
        status = rec.get("status")
        if status == "completed":
            out[float(rec["multiplier"])] = (rec.get("final") or {}).get("val_loss")
        elif status == "diverged" or rid in attempted:
            out[float(rec["multiplier"])] = None
    return out


def cell_decision(spec: StudySpec, results: Mapping[float, float | None]) -> SweepDecision:
    return decide(spec.sweep.multipliers, results, extend=spec.sweep.extend,
                  max_extensions=spec.sweep.max_extensions)


def sweep_runs(spec: StudySpec, arm: StudyArm, optimizer: Optimizer, multipliers: Iterable[float],
               data_dir: str, note: str = "", point: "DataPoint | None" = None) -> list[PlannedRun]:
    base = arm.base_lr_for(spec, optimizer)
    return [make_run(spec, arm, optimizer, round_lr(base * m), spec.sweep_seed, spec.sweep.tokens,
                     "sweep", data_dir, multiplier=m, note=note, point=point) for m in multipliers]


def final_runs(spec: StudySpec, arms: list[StudyArm], locks: Mapping[tuple[str, str], float],
               data_dir: str, note: str = "", point: "DataPoint | None" = None) -> list[PlannedRun]:
    """Every arm × optimizer × budget × seed at its locked LR, plus the noise-floor pair
    (at one data point: every point of a data axis gets its own).

    Cells without a lock (every sweep point failed) are left out.
    """
    runs: list[PlannedRun] = []
    for arm, opt in cells(spec, arms):
        if (arm.name, opt) not in locks:
            continue
        for tokens in spec.final.tokens:
            for seed in spec.seeds:
                runs.append(make_run(spec, arm, opt, locks[(arm.name, opt)], seed, tokens,
                                     "final", data_dir, note=note, point=point))
    ref = arms[0]
    opt = spec.noise_optimizer
    if spec.noise.enabled and (ref.name, opt) in locks:
        lr = locks[(ref.name, opt)]
        for arm in (ref, noise_arm(spec)):
            for seed in spec.noise_seeds:
                runs.append(make_run(spec, arm, opt, lr, seed, spec.noise_tokens, "noise", data_dir,
                                     note=note, point=point))
    return runs


# --------------------------------------------------------------------------- the plan


@dataclass
class StudyPlan:
    """Every run a study will do as far as it is known now, with its cost."""

    arms: list[StudyArm]
    runs: list[PlannedRun]
    notes: list[str] = field(default_factory=list)
    tokens_per_s: float = 0.0
    workers: int = 1  # runs in parallel (local workers, or the SLURM array parallelism)
    # run id -> measured {step_s, eval_s, ready_s} of its shape (sanlab.study.speed)
    speeds: dict[str, dict[str, float]] = field(default_factory=dict)
    max_extensions: int = 0  # sweep rounds boundary extension may add (0: extension off)
    # cell_key(data slug, arm, optimizer) -> sweep points boundary extension may still add beyond `runs`
    extension_room: dict[tuple[str, ...], int] = field(default_factory=dict)
    stream: bool = False  # the runner streams the sweep and the final runs (the local one)
    noise_optimizer: str = ""  # the noise pair's optimizer (its runs train at the reference's lock)
    # each worker's runs fork from a warm process (the local runner on the CPU, sanlab.study.warm):
    # its imports (`ready_s`) are paid once a worker, each run then starts in `WARM_START_S`
    warm: bool = False

    @property
    def max_extension_runs(self) -> int:
        """The most runs boundary extension can add to `runs` (each cell's remaining
        extension budget, summed): the plan's "N runs + up to M sweep extensions"."""
        return sum(self.extension_room.values())

    def start_seconds(self, run: PlannedRun) -> float:
        """A process's start before it builds its model (a run's, or a member group's: once
        for all its members): a fresh process's imports (measured `ready_s`), or, forked
        from a warm process, `WARM_START_S`. Untimed shapes: 0 (their FLOP-scaled estimate
        has no start of its own)."""
        speed = self.speeds.get(run.run_id)
        if speed is None:
            return 0.0
        return WARM_START_S if self.warm else speed["ready_s"]

    @property
    def startup_seconds(self) -> float:
        """Paid once before the first run: the warm processes' imports (`ready_s`; they start
        while `study run` prepares the data), or 0 when each run starts a process of its own."""
        return max((s["ready_s"] for s in self.speeds.values()), default=0.0) if self.warm else 0.0

    def run_seconds(self, run: PlannedRun, start: bool = True) -> float:
        """Time estimate of one run. Timed shapes: its process's start (`start_seconds`;
        `start=False`: without it, as a member of a group, whose process starts once) and
        building the model + steps × measured step time + evaluations (the initial one,
        every `eval_every` steps and the last) × measured evaluation time + checkpoints
        (the initial one, milestones, every `checkpoint_every` steps and the last) ×
        measured save time. Otherwise the reference's throughput scaled by FLOPs per token."""
        speed = self.speeds.get(run.run_id)
        if speed is None:
            ref_flops = self.arms[0].flops_per_token
            return run.tokens / (self.tokens_per_s * ref_flops / run.flops_per_token)
        t, trained = run.config.train, make_plan(run.config, 1)
        steps = trained.steps

        def every(k: int) -> set[int]:  # steps k, 2k, … and the last (as the trainer's loop)
            return set(range(k, steps + 1, k)) | {steps} if k else {steps}

        evals = 1 + len(every(t.eval_every))  # + the initial one
        saves = 1 + len(every(t.checkpoint_every) | (set(trained.milestones) - {0}))  # + the initial one (step 0)
        return ((self.start_seconds(run) if start else 0.0) + speed.get("setup_s", 0.0) + steps * speed["step_s"]
                + evals * speed["eval_s"] + saves * speed.get("save_s", 0.0))

    @property
    def total_flops(self) -> float:
        return float(sum(r.flops_per_token * r.tokens for r in self.runs))

    def makespan(self, runs: Iterable[PlannedRun]) -> float:
        return makespan([self.run_seconds(r) for r in runs], self.workers)

    @property
    def total_seconds(self) -> float:
        """Wall time as `study run` executes the runs: streamed on the local runner
        (`stream_makespan`), else the sweep points as one batch, then the final and noise
        runs as another (each batch waits for its slowest worker)."""
        if self.stream:
            return self.startup_seconds + stream_makespan(
                [(self.run_seconds(r), [r]) for r in self.runs], self.workers,
                self.arms[0].name if self.arms else "", self.noise_optimizer)
        sweep = [r for r in self.runs if "sweep" in r.phases]
        return (self.startup_seconds + self.makespan(sweep)
                + self.makespan([r for r in self.runs if "sweep" not in r.phases]))

    @property
    def extension_seconds(self) -> float:
        """The most boundary extension can add: as many more sweep rounds as the most room
        any cell has left, each one more point per cell that can still extend, run side
        by side."""
        per_cell: dict[tuple[str, ...], PlannedRun] = {}
        for r in self.runs:
            key = cell_key(r.data, r.arm, r.optimizer)
            if "sweep" in r.phases and self.extension_room.get(key, 0) > 0:
                per_cell.setdefault(key, r)
        rounds = max(self.extension_room.values(), default=0)
        return rounds * self.makespan(per_cell.values()) if per_cell else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "arms": [{"name": a.name, "role": a.role, "kind": a.kind, "label": a.label,
                      "train": dict(a.train), "base_lr": dict(a.base_lr),
                      "params_total": a.params_total, "params_non_embedding": a.params_non_embedding,
                      "train_flops_per_token": a.flops_per_token, "mismatch": a.mismatch,
                      "model": a.model.model_dump()} for a in self.arms],
            "runs": [{**r.to_dict(), "est_seconds": self.run_seconds(r),
                      "flops": r.flops_per_token * r.tokens} for r in self.runs],
            "notes": self.notes,
            "total_flops": self.total_flops,
            "est_seconds": self.total_seconds,
            "est_extension_seconds": self.extension_seconds,
            "max_extension_runs": self.max_extension_runs,
            "tokens_per_s": self.tokens_per_s,
            "workers": self.workers,
            "timed": sorted({r.arm for r in self.runs if r.run_id in self.speeds}),
        }


def default_data_dir(spec: StudySpec, study_dir: str | Path | None) -> str:
    """Where the study reads its data: `data.dir`, else `data/` inside the study dir."""
    if spec.data.dir is not None:
        return spec.data.dir
    return str(Path(study_dir) / "data") if study_dir is not None else "<study dir>/data"


def sweeps_at(spec: StudySpec, points: list[DataPoint], point: DataPoint) -> bool:
    """Whether `point` runs its own sweep (every point does, unless `sweep.lock_at` names one)."""
    return spec.sweep.enabled and sweep_point(spec, points, point) == point


def plan_study(spec: StudySpec, study_dir: str | Path | None = None,
               records: Mapping[str, dict] | None = None,
               locks: Mapping[tuple[str, str], float] | None = None,
               point_locks: Mapping[str, Mapping[tuple[str, str], float]] | None = None) -> StudyPlan:
    """The runs known now. Without results: the initial sweep grid, and final runs at
    the base LR (×1) marked as provisional, since the sweep decides their LR.

    `locks`: the known locks of a study without a data axis; `point_locks`: data slug ->
    the known locks at that data point (`sanlab.study.table.locks_by_point`)."""
    records = records or {}
    points = data_points(spec, study_dir)
    arms = build_arms(spec)
    runs: list[PlannedRun] = []
    notes: list[str] = []
    known: dict[str, dict[tuple[str, str], float]] = {k: dict(v) for k, v in (point_locks or {}).items()}
    if locks:
        known.setdefault("", {}).update(locks)
    room: dict[tuple[str, str], int] = {}
    if spec.sweep.enabled:
        ext = (f"boundary extension on (×2 / ×½ steps, at most {spec.sweep.max_extensions} per cell)"
               if spec.sweep.extend else "boundary extension off")
        notes.append(f"sweep: multipliers {spec.sweep.multipliers} of each cell's base LR at "
                     f"{format_tokens(spec.sweep.tokens)} tokens, seed {spec.sweep_seed}; {ext}")
        if spec.data.axis:
            where = (f"once, at {spec.data.axis_key}={spec.sweep.lock_at}; its locked LRs are reused at every "
                     "value" if spec.sweep.lock_at is not None else f"at every value of {spec.data.axis_key}")
            notes.append(f"data axis {spec.data.axis_key}: {', '.join(map(str, spec.data.axis_values))}; "
                         f"each prepared once; the sweep runs {where}")
    for point in points:
        if not sweeps_at(spec, points, point):
            continue
        for arm, opt in cells(spec, arms):
            results = sweep_results(spec, arm, opt, records, set(), point.slug)
            tried = sorted(set(results) | set(spec.sweep.multipliers))
            decision = cell_decision(spec, results)
            runs += sweep_runs(spec, arm, opt, tried, point.dir, point=point)
            planned = set(decision.pending) - set(tried)
            if decision.pending and planned:
                runs += sweep_runs(spec, arm, opt, decision.pending, point.dir,
                                   note="boundary extension", point=point)
            if spec.sweep.extend and not decision.done:
                room[cell_key(point.slug, arm.name, opt)] = max(
                    0, spec.sweep.max_extensions - decision.extensions - len(planned))
    any_provisional = False
    for point in points:
        known_locks = known.get(sweep_point(spec, points, point).slug, {})
        provisional = {}
        for arm, opt in cells(spec, arms):
            if (arm.name, opt) not in known_locks:
                provisional[(arm.name, opt)] = round_lr(arm.base_lr_for(spec, opt))
        any_provisional = any_provisional or bool(provisional)
        runs += final_runs(spec, arms, provisional, point.dir,
                           note="LR set by the sweep" if spec.sweep.enabled else "", point=point)
        runs += final_runs(spec, arms, known_locks, point.dir, point=point)
    if any_provisional and spec.sweep.enabled:
        notes.append("final / noise runs show the base LR (×1); the sweep locks the real LR, "
                     "so their LR and run id may change")
    parallel = spec.runner.workers if spec.runner.kind == "local" else spec.runner.slurm.array_parallelism
    extensions = spec.sweep.max_extensions if spec.sweep.enabled and spec.sweep.extend else 0
    local = spec.runner.kind == "local"
    return StudyPlan(arms, merge(runs), notes, spec.runner.tokens_per_s, parallel, max_extensions=extensions,
                     extension_room=room, stream=local, noise_optimizer=spec.noise_optimizer,
                     warm=local and not spec.runner.gpus_per_run and warm_enabled())
