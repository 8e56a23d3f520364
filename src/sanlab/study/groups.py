"""A study's runs trained as members of one batched model (`sanlab.train.members`).

The local runner (`runner.LocalRunner`) groups the runs it is given that share an
architecture, a data shape and a plan and differ only in what members may differ in (LR,
weight decay, schedule, seed, data dir: `sanlab.train.resolve.group_unsupported`): an arm's
sweep points and seeds. Each group trains in one worker process (`python -m
sanlab.study.groups GROUP.json`), which takes every member's run lock (in run-id order),
runs `train_members(..., resume=True)` and writes each member's outcome file as a solo
worker would (`runner.train_in_process`'s fields). Each member writes its ordinary run
dir, so the study's store, resume, status and report cannot tell a member from a solo run,
except meta.json's `members` entry (the batch it trained in).

`runner.members`: an int caps the group size (1: no grouping); "auto" (the default) groups
on the CPU where it pays: models up to `AUTO_MAX_D` wide, at most `AUTO_MAX_MEMBERS` a
group, groups of at least `AUTO_MIN_MEMBERS` (smaller ones run solo), and a class of runs
is split into more groups while there are fewer groups than workers; a batch that starts
on idle workers (a study's first sweep round; by rounds, each round) is then balanced by
its runs' costs (`balance`: a group is cut where that ends the batch sooner). Runs the members
engine refuses (`members_unsupported`: other mixers, frozen weights, torch.compile, ...),
GPU runs, and runs of a `train_fn` that cannot finish a member's run (`groupable`:
the trainer's runs and the probe suite's scored runs can) run solo. A killed grouped study resumes: the
next `study run` groups the runs still to do again (perhaps otherwise), and each member
resumes from its own checkpoint (`train_members` lets a member that is ahead wait).
"""

from __future__ import annotations

import fcntl
import importlib
import json
import math
import os
import sys
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

from sanlab.config import Config, validate
from sanlab.study.plan import makespan, stream_makespan
from sanlab.study.warm import die_with_parent
from sanlab.train.resolve import PER_MEMBER_OPTIM, PER_MEMBER_TRAIN, group_unsupported
from sanlab.train.resolve import resolve as resolve_config

# the study runner's default train_fn: the trainer itself
DEFAULT_TRAIN_FN = "sanlab.train.trainer:train"

# "auto": measured at the demo shape (SAN 5L d64 T128 batch 16, bf16, one thread): M members
# step in 1/1.06 (M = 2), 1/1.08-1.14 (M = 4), 1/1.16 (M = 8) of the time of M solo steps one
# after another (sanlab.model.members); wider models
# spend their time in large matmuls, where batching saves nothing and memory grows M-fold.
AUTO_MAX_D = 256
AUTO_MAX_MEMBERS = 8
AUTO_MIN_MEMBERS = 2
# a group's time against its members' solo times one after another (one thread, M = 2..8)
MEMBER_SPEEDUP = 1.05
# `balance` cuts a group only where the batch's estimated wall time falls by more than this
# share (each part is one more process start, and its members batch less)
BALANCE_GAIN = 0.05


def _class_key(cfg: Config) -> str:
    """What members must share (the fields they may differ in left out)."""
    d = json.loads(cfg.model_dump_json())
    for k in PER_MEMBER_OPTIM:
        d["optim"].pop(k, None)
    for k in (*PER_MEMBER_TRAIN, "steps", "tokens"):
        d["train"].pop(k, None)
    d["data"].pop("dir", None)
    return json.dumps(d, sort_keys=True)


def _cap(setting: int | str, cfg: Config) -> int:
    """The most members a group of runs like `cfg` may hold (1: train solo)."""
    if setting == "auto":
        if cfg.train.device not in ("cpu", "auto") or cfg.model.d_model > AUTO_MAX_D:
            return 1
        return AUTO_MAX_MEMBERS
    return int(setting)


def plan_groups(configs: Sequence[dict[str, Any]], setting: int | str, workers: int = 1,
                costs: Sequence[float] | None = None) -> list[list[int]]:
    """Indices of `configs` (run configs as JSON data) in groups: each inner list trains as
    the members of one model (one index: solo). Order: the groups in the order of their
    first run. With `costs` (each run's, as the local runner orders them) and "auto", the
    groups are then split where that shortens the batch's wall time (`balance`)."""
    if setting == 1 or len(configs) < 2:
        return [[i] for i in range(len(configs))]
    classes: dict[str, list[int]] = {}
    cfgs: list[Config] = []
    caps: dict[str, int] = {}
    solo: list[list[int]] = []
    for i, raw in enumerate(configs):
        cfg = resolve_config(validate(Config, raw, source="run config"))
        cfgs.append(cfg)
        cap = _cap(setting, cfg)
        if cap <= 1 or group_unsupported([cfg]) is not None:
            solo.append([i])
            continue
        key = _class_key(cfg)
        classes.setdefault(key, []).append(i)
        caps[key] = cap
    lo = AUTO_MIN_MEMBERS if setting == "auto" else 2
    counts = {k: math.ceil(len(v) / caps[k]) for k, v in classes.items()}
    while setting == "auto" and sum(counts.values()) + len(solo) < workers:  # keep the workers busy
        k = max(counts, key=lambda k: len(classes[k]) / counts[k], default=None)
        if k is None or len(classes[k]) / (counts[k] + 1) < lo:
            break
        counts[k] += 1
    groups = list(solo)
    for k, idx in classes.items():
        n = counts[k]
        for g in range(n):  # even splits, in order
            part = idx[len(idx) * g // n:len(idx) * (g + 1) // n]
            if len(part) >= lo and group_unsupported([cfgs[i] for i in part]) is None:
                groups.append(part)
            else:
                groups += [[i] for i in part]
    if costs is not None and setting == "auto":
        groups = balance(groups, costs, workers)
    return sorted(groups, key=lambda g: g[0])


def _parts(group: list[int], n: int) -> list[list[int]]:
    """`group` cut into `n` even parts, in order (a part of one run trains solo)."""
    return [group[len(group) * k // n:len(group) * (k + 1) // n] for k in range(n)]


def _unit_cost(part: list[int], costs: Sequence[float]) -> float:
    """What a part costs a worker: its runs' costs summed, / MEMBER_SPEEDUP for members."""
    total = sum(costs[i] for i in part)
    return total / MEMBER_SPEEDUP if len(part) > 1 else total


def balance(groups: list[list[int]], costs: Sequence[float], workers: int) -> list[list[int]]:
    """`groups` with some cut into even parts where that shortens the batch's wall time on
    `workers` workers that each take the costliest unit left when they free up (the local
    runner's order, `sanlab.study.plan.makespan`): one group at a time, the cut that
    shortens it most, while a cut shortens it by more than BALANCE_GAIN. One arm three
    times as costly as the others, as one group, keeps a worker busy while the other
    trains the rest and then waits (the demo's first sweep round on a 2-core CPU: the
    iso-depth group 26 s against the other arms' 13 + 12 + 9 s). Unknown costs (0) leave
    the groups as they are."""
    if workers < 2 or not groups or min(costs[i] for g in groups for i in g) <= 0:
        return groups
    cuts = [1] * len(groups)

    def span(cuts: list[int]) -> float:
        return makespan([_unit_cost(p, costs) for g, n in zip(groups, cuts) for p in _parts(g, n)], workers)

    now = span(cuts)
    while True:
        trials = [(span(t), t) for i, g in enumerate(groups) for n in range(1, len(g) + 1) if n != cuts[i]
                  for t in [cuts[:i] + [n] + cuts[i + 1:]]]
        if not trials:
            break
        best, trial = min(trials, key=lambda x: x[0])
        if best >= now * (1 - BALANCE_GAIN):
            break
        now, cuts = best, trial
    return [p for g, n in zip(groups, cuts) for p in _parts(g, n)]


def _phase_units(plan: Any, setting: int | str, workers: int) -> list[tuple[str, list[Any], list[list[int]]]]:
    """(phase, its planned runs, their groups) as `study run` groups them: the sweep's runs
    apart from the final ones, each batch that starts on idle workers balanced by its runs'
    estimates (`balance`: the sweep's first round; by rounds, the final runs too; streamed,
    each cell's final runs join the stream as it locks and are not)."""
    out = []
    for phase in ("sweep", "final"):
        runs = [r for r in plan.runs if ("sweep" in r.phases) == (phase == "sweep")]
        costs = ([plan.run_seconds(r, start=False) for r in runs]
                 if phase == "sweep" or not getattr(plan, "stream", False) else None)
        out.append((phase, runs, plan_groups([json.loads(r.config.model_dump_json()) for r in runs], setting,
                                             workers, costs)))
    return out


def _unit_seconds(plan: Any, runs: list[Any], group: list[int]) -> float:
    """A group's estimate: its process's start, once, + its members' solo estimates without
    it summed / MEMBER_SPEEDUP (a run left solo: its own)."""
    if len(group) == 1:
        return plan.run_seconds(runs[group[0]])
    return (plan.start_seconds(runs[group[0]])
            + sum(plan.run_seconds(runs[i], start=False) for i in group) / MEMBER_SPEEDUP)


def plan_table_rows(plan: Any, setting: int | str, workers: int) -> list[tuple[str, list[str], float]]:
    """`study plan`'s member groups: (phase, run ids, estimated seconds) per group of two or more."""
    return [(phase, [runs[i].run_id for i in g], _unit_seconds(plan, runs, g))
            for phase, runs, groups in _phase_units(plan, setting, workers) for g in groups if len(g) > 1]


def plan_seconds(plan: Any, setting: int | str, workers: int) -> float:
    """The study's wall time with member groups: each group one unit and each run left solo
    another, streamed over the workers as the local runner streams them
    (`sanlab.study.plan.stream_makespan`); without a stream per phase (the sweep, then the
    rest), longest first (`sanlab.study.plan.makespan`). A few large groups can take longer
    than their runs would solo: the workers balance coarser units."""
    phases = _phase_units(plan, setting, workers)
    if getattr(plan, "stream", False):
        units = [(_unit_seconds(plan, runs, g), [runs[i] for i in g]) for _, runs, groups in phases for g in groups]
        return plan.startup_seconds + stream_makespan(units, workers, plan.arms[0].name if plan.arms else "",
                                                      plan.noise_optimizer)
    return plan.startup_seconds + sum(makespan([_unit_seconds(plan, runs, g) for g in groups], workers)
                                      for _, runs, groups in phases)


# --------------------------------------------------------------------------- the worker


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def resolve(path: str) -> Callable[..., dict[str, Any]]:
    """The function a train_fn string ("module:function") names."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def groupable(train_fn: str) -> bool:
    """Whether runs of `train_fn` may train as members of one model: the trainer's own
    runs, and a train_fn that says how a member's run is finished after the members
    trained (`fn.finish_member(cfg, run_dir, meta) -> meta`, what it does after the
    trainer: the probe suite's scoring)."""
    if train_fn == DEFAULT_TRAIN_FN:
        return True
    try:
        return callable(getattr(resolve(train_fn), "finish_member", None))
    except (ImportError, AttributeError, ValueError):
        return False


def _finish(job: dict[str, Any], cfg: Config, run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A member's meta after its train_fn's own finishing step (`groupable`: the probe
    suite scores a completed run), run in the member's run dir as a solo worker runs its
    train_fn; a finishing step that raises fails this member only."""
    train_fn = job.get("train_fn", DEFAULT_TRAIN_FN)
    if train_fn == DEFAULT_TRAIN_FN:
        return meta
    cwd = os.getcwd()
    os.chdir(run_dir)
    try:
        return dict(resolve(train_fn).finish_member(cfg, run_dir, meta))  # type: ignore[attr-defined]
    except Exception as e:
        traceback.print_exc()
        return {**meta, "status": "failed", "error": f"{type(e).__name__}: {e}"}
    finally:
        os.chdir(cwd)


def train_group(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train the jobs (`runner.Job` fields) as members of one model under their locks and
    return each one's outcome as `runner.train_in_process` returns a solo run's; never raises."""
    # lazy: torch and the trainer load only in the worker process
    from sanlab.train.members import train_members

    t0 = time.time()
    try:
        cfgs = [validate(Config, j["config"], source=f"run {j['run_id']}") for j in jobs]
        dirs = [Path(j["run_dir"]).absolute() for j in jobs]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            for j in sorted(jobs, key=lambda j: j["run_id"]):  # one order: no two groups deadlock
                lock = stack.enter_context(open(Path(j["jobs_dir"]) / f"{j['run_id']}.lock", "a+"))
                fcntl.flock(lock, fcntl.LOCK_EX)
            cwd = os.getcwd()
            # the runs are siblings, so a relative data.dir (the study's own data) means the
            # same from any of them (runner.train_in_process: a run trains in its run dir)
            os.chdir(dirs[0])
            try:
                metas = train_members(cfgs, dirs, resume=True)
                metas = [_finish(j, c, d, dict(m)) for j, c, d, m in zip(jobs, cfgs, dirs, metas)]
            finally:
                os.chdir(cwd)
    except Exception as e:  # a crashing group is a recorded outcome for each member; the study goes on
        traceback.print_exc()
        return [{"status": "failed", "final": {}, "error": f"{type(e).__name__}: {e}", "wall_s": time.time() - t0}
                for _ in jobs]
    return [{"status": m.get("status", "failed"), "final": m.get("final") or {}, "error": m.get("error"),
             "accounting": m.get("accounting"), "tokens_per_s": m.get("tokens_per_s"), "wall_s": time.time() - t0,
             "members": len(jobs)}  # tokens_per_s is this member's; its group trained len(jobs)× that
            for m in metas]


def main(argv: Sequence[str]) -> int:
    """`python -m sanlab.study.groups GROUP.json`: GROUP.json holds `{"jobs": [JOB, ...]}`
    (`runner.Job` fields); each member's outcome goes to its job's outcome file."""

    group = json.loads(Path(argv[0]).read_text())
    parent = os.environ.get("SANLAB_PARENT_PID")
    die_with_parent()
    if parent is not None and os.getppid() != int(parent):
        return 1  # the study died before the death signal was armed
    jobs = group["jobs"]
    if jobs and jobs[0].get("threads"):
        os.environ["OMP_NUM_THREADS"] = str(jobs[0]["threads"])
    for job, outcome in zip(jobs, train_group(jobs)):
        _write_json(Path(job["jobs_dir"]) / f"{job['run_id']}.outcome.json", outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
