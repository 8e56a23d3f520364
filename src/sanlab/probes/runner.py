"""Train probe arms on probe tasks: data, per-cell LR sweep, scoring, results.

A *cell* is one task (with its config) × one arm. Each cell gets its own learning-rate
sweep over multipliers of the base `optim.lr`, with the study's boundary extension
(`sanlab.study.sweep.decide`): if the best point is at an edge of what was tried, the
next point past that edge is added, up to `sweep.max_extensions`. The selection
criterion is the *validation* error rate (1 − exact-match accuracy), ties broken by the
validation answer loss; the accuracy reported is the *test* split's at the selected LR
(for memorization both are the training set, as the task defines).

Runs are ordinary trainer runs (`sanlab.train.trainer.train`: checkpoints, resume,
metrics.jsonl, divergence handling), executed by the study's local runner
(`sanlab.study.runner.LocalRunner`): one process per run, `runner.workers` at a time,
one CPU thread each by default (tiny models gain little from a second thread, and two
single-threaded runs use two cores fully); a cell's pending sweep points train as the
members of one batched model in one process where the runner groups them
(`runner.members`, "auto" by default: `sanlab.study.groups`), each scored after training
as a solo run is (`score_run`). Each run dir gets a `probe.json` with its val / test
accuracy. Rerunning the same command reuses every finished run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import model_validator

from sanlab.config import Config, StrictModel, apply_overrides
from sanlab.data.probes import ProbeData, TaskConfig, get_task, plan_probe_dir, task_config
from sanlab.errors import ConfigError
from sanlab.probes.arms import Arm, data_override
from sanlab.probes.layout import DATA, JOBS, RUNS
from sanlab.study.runner import Job, LocalRunner
from sanlab.study.spec import RunnerSpec
from sanlab.study.sweep import decide

PROBE_FILE = "probe.json"
TRAIN_FN = "sanlab.probes.runner:train_and_score"

# The probe model and run (SPEC §2: 2 layers for algorithmic tasks). Arm presets and
# the user's overrides apply on top, in that order. Muon at the project's base LR: on
# retrieval (m <= 8) it reached 99% test accuracy in 600 steps where AdamW at 3e-3 was at
# 30% (measured, standard arm, batch 8).
BASE_OVERRIDES: tuple[str, ...] = (
    "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
    "optim.name=muon", "optim.lr=0.02", "optim.adam_lr=3e-3", "optim.warmup_frac=0.05", "optim.decay_frac=0.2",
    "train.batch_rows=8", "train.eval_every=0", "train.milestones=[1.0]", "train.log_every=50",
)

# Each task's settings and training length, full and --quick, are the task's own (`full`,
# `quick` of its file in sanlab.data.probes). The quick budgets are sized so `sanlab probe
# --suite --quick` (every preset arm, a 3-point LR sweep per cell) fits about 15 minutes
# on a 2-core CPU.
# --quick also shrinks the sweep and the capacity grid (user overrides still win).
# The quick capacity cell is one N on a d=16 model (about 8.5k trainable parameters for
# the standard arm) so it is not trivially memorised; at 300 steps it is far from
# converged, so its bits/param reads as an ordering, not as the paper's capacity.
# The capacity cells' model: d_model 16 (8,548 trainable parameters for the standard arm,
# 2,370 for the SAN). At the paper's 2.98 bits/param the standard arm holds ~6,400 labels
# of 4 bits, between the grid's 4096 and 16384; at d_model 64 (126k parameters) it would
# need ~94,000, more than the 65,536 keys of the task, so no N of the grid could bracket it.
CAPACITY_MODEL: tuple[str, ...] = ("model.d_model=16",)
QUICK_OPTIONS: tuple[str, ...] = ("sweep.max_extensions=0", "capacity.ns=[4096]",
                                  'capacity.model=["model.d_model=16", "train.steps=300"]')


class SweepSettings(StrictModel):
    """`sweep.*`: the per-cell LR sweep (multipliers of optim.lr)."""

    enabled: bool = True
    grid: list[float] = [0.5, 1.0, 2.0]
    max_extensions: int = 2

    @model_validator(mode="after")
    def _check(self) -> "SweepSettings":
        if not self.grid or any(not (math.isfinite(m) and m > 0) for m in self.grid):
            raise ValueError("grid must be a non-empty list of positive multipliers")
        if self.max_extensions < 0:
            raise ValueError(f"max_extensions must be >= 0, got {self.max_extensions}")
        return self


class CapacitySettings(StrictModel):
    """`capacity.*`: the N values of the memorization-capacity sweep."""

    ns: list[int] = [4096, 16384, 65536]  # 65536 = every key of the default 16 symbols ^ 4
    model: list[str] = list(CAPACITY_MODEL)
    """Run overrides for the capacity cells only (after the task's, before the arm's, so an
    arm's or the command line's `model.*` still wins). Default d_model 16: the N grid then
    brackets the paper's capacities (docs/commands/probe.md, "Capacity: the model size");
    `capacity.model=[]` keeps the probe model (d_model 64)."""

    @model_validator(mode="after")
    def _check(self) -> "CapacitySettings":
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError("ns must be a non-empty list of positive pair counts")
        for item in self.model:
            key = item.split("=", 1)[0].strip()
            if "=" not in item or key.split(".", 1)[0] not in ("model", "optim", "train") or "." not in key:
                raise ValueError(f"capacity.model item {item!r}: expected model.*/optim.*/train.* key=value")
        return self


class ProbeOptions(StrictModel):
    """Everything besides the run config and the task config (`sweep.*`, `capacity.*`, `runner.*`)."""

    sweep: SweepSettings = SweepSettings()
    capacity: CapacitySettings = CapacitySettings()
    runner: RunnerSpec = RunnerSpec(workers=max(1, os.cpu_count() or 1), threads=1)
    row_tokens: int = 256  # tokens per packed row (a whole number of examples)

    @model_validator(mode="after")
    def _check(self) -> "ProbeOptions":
        if self.runner.kind != "local":
            raise ValueError("runner.kind: probes run on the local runner only")
        if self.row_tokens < 8:
            raise ValueError(f"row_tokens must be at least 8, got {self.row_tokens}")
        return self


@dataclass
class Overrides:
    """The command line's `key=value` items, sorted by where they go."""

    run: list[str] = field(default_factory=list)  # model.* optim.* train.*
    task: list[str] = field(default_factory=list)  # task.* (prefix stripped)
    options: list[str] = field(default_factory=list)  # sweep.* capacity.* runner.* row_tokens

    @classmethod
    def parse(cls, items: Sequence[str]) -> "Overrides":
        out = cls()
        for item in items:
            if "=" not in item:
                raise ConfigError(f"override {item!r}: expected section.key=value")
            section = item.split("=", 1)[0].split(".", 1)[0].strip()
            if section in ("model", "optim", "train"):
                out.run.append(item)
            elif section == "task":
                out.task.append(item.split(".", 1)[1] if "." in item.split("=", 1)[0] else item)
            elif section in ("sweep", "capacity", "runner", "row_tokens"):
                out.options.append(item)
            elif section == "data":
                raise data_override(item)
            else:
                raise ConfigError(f"override {item}: unknown section {section!r} "
                                  "(use model.*, optim.*, train.*, task.*, sweep.*, capacity.*, runner.*)")
        return out

    def options_model(self, quick: bool = False) -> ProbeOptions:
        return apply_overrides(ProbeOptions, {}, [*(QUICK_OPTIONS if quick else ()), *self.options],
                               source="probe")


def task_settings(task: str, quick: bool, user_task: Sequence[str]) -> tuple[TaskConfig, list[str]]:
    """The task config and the run overrides a task gets by default, user overrides on top."""
    defaults = get_task(task).defaults(quick)
    t_items = [d.split(".", 1)[1] for d in defaults if d.startswith("task.")]
    run_items = [d for d in defaults if not d.startswith("task.")]
    return task_config(task, [*t_items, *user_task]), run_items


def _short_hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:8]


@dataclass
class Point:
    multiplier: float
    lr: float
    run_dir: str  # relative to the probe's --out dir: runs/RUN_ID
    status: str | None = None
    val_accuracy: float | None = None
    test_accuracy: float | None = None
    test_correct: int | None = None
    test_total: int | None = None
    val_loss: float | None = None
    wall_s: float | None = None  # the run's training wall time (meta.json's wall_time_s), also when reused
    error: str | None = None

    def criterion(self) -> float | None:
        """Validation error rate, ties broken by the validation answer loss; None = failed."""
        if self.status != "completed" or self.val_accuracy is None:
            return None
        loss = self.val_loss if self.val_loss is not None and math.isfinite(self.val_loss) else 1e3
        return (1.0 - self.val_accuracy) + 1e-6 * min(loss, 1e3)


@dataclass
class Cell:
    """One task (config) × one arm, with its sweep points."""

    key: str  # e.g. "retrieval/standard" or "capacity-n512/standard"
    task: str
    arm: Arm
    task_cfg: TaskConfig
    config: Config  # the run config at multiplier 1 (data dir set)
    sweep: SweepSettings
    data: ProbeData  # the task's data dir (planned; written before the first run)
    points: dict[float, Point] = field(default_factory=dict)

    def results(self) -> dict[float, float | None]:
        return {m: p.criterion() for m, p in self.points.items() if p.status is not None}

    def failed(self) -> bool:
        """Every point run so far failed (an error, not a divergence): no LR was selected
        and none would be by another LR, so the sweep does not extend past its grid."""
        done = [p for p in self.points.values() if p.status is not None]
        return bool(done) and all(p.status not in ("completed", "diverged") for p in done)

    def first_error(self) -> str | None:
        """The error of the first failed point in the order the sweep ran them (×1 first)."""
        bad = [p for p in self.points.values() if p.status not in (None, "completed", "diverged")]
        bad.sort(key=lambda p: (abs(math.log2(p.multiplier)), p.multiplier))
        return next((p.error or f"run {p.status}" for p in bad), None)

    def decision(self) -> Any:
        grid = self.sweep.grid if self.sweep.enabled else [1.0]
        extend = self.sweep.enabled and not self.failed()
        return decide(grid, self.results(), extend=extend, max_extensions=self.sweep.max_extensions)

    def best(self) -> Point | None:
        d = self.decision()
        return self.points.get(d.best) if d.best is not None else None

    def summary(self) -> dict[str, Any]:
        d, best = self.decision(), self.best()
        return {
            "key": self.key, "task": self.task, "arm": self.arm.name, "label": self.arm.label,
            "arm_overrides": list(self.arm.overrides), "task_config": self.task_cfg.model_dump(mode="json"),
            "base_lr": self.config.optim.lr, "multiplier": d.best, "lr": best.lr if best else None,
            # an edge is a statement about a selected LR: a cell with none has no edge
            "at_edge": d.at_edge and self.sweep.enabled and best is not None,
            "failed": self.failed(), "error": self.first_error() if best is None else None,
            "val_accuracy": best.val_accuracy if best else None,
            "test_accuracy": best.test_accuracy if best else None,
            "test_correct": best.test_correct if best else None, "test_total": best.test_total if best else None,
            "points": [vars(p) for _, p in sorted(self.points.items())],
        }




def run_data_dir(data: ProbeData) -> str:
    """`data.dir` as a probe run records it: relative to the run dir (`../../data/NAME`).

    Runs train with their run dir as the working directory (`sanlab.study.runner`), and
    every run dir is `DIR/runs/RUN_ID`, so this names the same dir wherever DIR is, from
    any working directory, and it keeps the run's config (and so its id) the same when
    DIR moves or is spelled differently. It is the study's rule for data inside the
    study dir (`sanlab.study.orchestrate.portable_data_dir`).
    """
    return os.path.join(os.pardir, os.pardir, DATA, data.out.name)


def make_cell(key: str, task: str, arm: Arm, task_cfg: TaskConfig, run_items: Sequence[str],
              user_run: Sequence[str], opts: ProbeOptions, out: Path,
              planned: dict[Path, ProbeData] | None = None) -> Cell:
    """Plan the task's data (generated in memory, or an existing dir reused) and resolve the
    arm's run config on its layout. Nothing is written: `Cell.data.write()` does that.
    `planned` shares one plan between the cells (arms) of the same task config."""
    planned = {} if planned is None else planned
    data_dir = out / DATA / f"{task}-{_short_hash([task_cfg.model_dump(mode='json'), opts.row_tokens])}"
    if data_dir not in planned:
        planned[data_dir] = plan_probe_dir(get_task(task), task_cfg, data_dir, row_tokens=opts.row_tokens)
    data = planned[data_dir]
    items = [*BASE_OVERRIDES, *run_items, *arm.overrides, *user_run,
             f"data.dir={run_data_dir(data)}", f"data.seq_len={data.seq_len}",
             f"model.vocab_size={data.vocab_size}", f"train.eval_rows={data.rows['val']}"]
    cfg = apply_overrides(Config, {}, items, source=f"arm {arm.name}")
    return Cell(key, task, arm, task_cfg, cfg, opts.sweep, data)


def check_run_config(arm: Arm, run_items: Sequence[str], user_run: Sequence[str]) -> None:
    """The arm's run config without the data's settings (row length, vocabulary, val rows):
    every error that does not depend on the data, found before any data is generated."""
    apply_overrides(Config, {}, [*BASE_OVERRIDES, *run_items, *arm.overrides, *user_run], source=f"arm {arm.name}")


def _point_config(cell: Cell, multiplier: float) -> tuple[Config, float]:
    lr = float(f"{cell.config.optim.lr * multiplier:.6g}")
    return cell.config.model_copy(update={"optim": cell.config.optim.model_copy(update={"lr": lr})}), lr


def _job(cell: Cell, multiplier: float, out: Path) -> tuple[Job, Point]:
    cfg, lr = _point_config(cell, multiplier)
    data = json.loads(cfg.model_dump_json())
    run_id = f"{cell.key.replace('/', '-')}-lr{lr:g}-{_short_hash(data)}"
    run_dir = f"{RUNS}/{run_id}"  # relative to DIR, as the results files keep it
    return Job(run_id=run_id, run_dir=os.path.abspath(out / run_dir), config=data,
               jobs_dir=os.path.abspath(out / JOBS), train_fn=TRAIN_FN), Point(multiplier, lr, run_dir)


RUN_WALL = "run_wall_s"


def train_and_score(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """The trainer, then exact-match accuracy on val and test (written to probe.json).

    Same signature as `sanlab.train.trainer.train` (the study runner calls it as its
    `train_fn`); the accuracies come back in `meta["final"]`.
    """
    # lazy: torch; the config reference (sanlab.configref, the docs build) reads this module without it
    from sanlab.train.trainer import train

    return score_run(cfg, out_dir, dict(train(cfg, out_dir, resume=resume, force=force)))


def score_run(cfg: Config, out_dir: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A trained run's meta with its val and test accuracy (probe.json, computed once per
    finished training): what `train_and_score` does after the trainer, and what the study
    runner does for a probe run that trained as a member of a batched model
    (`sanlab.study.groups.groupable`)."""
    # lazy: torch; the config reference (sanlab.configref, the docs build) reads this module without it
    from sanlab.probes.evaluate import run_accuracy
    from sanlab.train.rundir import read_json, write_json

    if meta.get("status") != "completed":
        return meta
    path = Path(out_dir) / PROBE_FILE
    scored = read_json(path)
    if scored is None or scored.get("finished_at") != meta.get("finished_at"):
        acc = run_accuracy(out_dir)
        scored = {"finished_at": meta.get("finished_at"), **{f"{s}_{k}": v for s, a in acc.items() for k, v in a.items()}}
        write_json(path, scored)
    meta["final"] = {**(meta.get("final") or {}), **{k: v for k, v in scored.items() if k != "finished_at"},
                     # the run's own wall time over all its sessions: a reused run reports it, not the reuse
                     RUN_WALL: meta.get("wall_time_s")}
    return meta


# the probe runs' sweep points train as members of one model where the runner groups them
train_and_score.finish_member = score_run  # type: ignore[attr-defined]

ProgressFn = Callable[[Cell, Point, int], None]


def run_cells(cells: Sequence[Cell], opts: ProbeOptions, out: Path, progress: ProgressFn | None = None,
              on_round: Callable[[int, int], None] | None = None,
              after_round: Callable[[], None] | None = None) -> None:
    """Sweep every cell to its decision, round by round; all pending points of a round
    run in parallel on the local runner. `after_round` runs after each round (the CLI
    writes the results so far)."""
    runner = LocalRunner(opts.runner)
    try:
        _rounds(runner, cells, out, progress, on_round, after_round)
    finally:
        runner.close()


def _rounds(runner: LocalRunner, cells: Sequence[Cell], out: Path, progress: ProgressFn | None,
            on_round: Callable[[int, int], None] | None, after_round: Callable[[], None] | None) -> None:
    """`run_cells`' rounds on `runner`."""
    round_no, done = 0, 0
    while True:
        batch: list[tuple[Job, Point, Cell]] = []
        for cell in cells:
            d = cell.decision()
            for m in d.pending:
                job, point = _job(cell, m, out)
                batch.append((job, point, cell))
        if not batch:
            return
        # The ×1 point of every cell first, then the points around it: a stopped or
        # still-running suite has a whole table early (the sort is stable in cell order).
        batch.sort(key=lambda item: abs(math.log2(item[1].multiplier)))
        round_no += 1
        if on_round is not None:
            on_round(round_no, len(batch))
        by_id = {job.run_id: (point, cell) for job, point, cell in batch}

        def on_done(job: Job, outcome: dict[str, Any]) -> None:
            nonlocal done
            point, cell = by_id[job.run_id]
            final = outcome.get("final") or {}
            point.status = outcome.get("status", "failed")
            point.val_accuracy = final.get("val_accuracy")
            point.test_accuracy = final.get("test_accuracy")
            point.test_correct = final.get("test_correct")
            point.test_total = final.get("test_total")
            point.val_loss = final.get("val_loss")
            point.wall_s = final.get(RUN_WALL) if final.get(RUN_WALL) is not None else outcome.get("wall_s")
            point.error = outcome.get("error")
            cell.points[point.multiplier] = point
            done += 1
            if progress is not None:
                progress(cell, point, done)

        runner.run([job for job, _, _ in batch], on_done)
        if after_round is not None:
            after_round()
