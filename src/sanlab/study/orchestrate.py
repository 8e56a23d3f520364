"""`study run`: sweep, boundary extension, lock, final runs, noise floor (SPEC §1.4).

Study dir layout:

    DIR/study.json        the resolved spec this dir was last run with (status/table read it)
    DIR/results.jsonl     the results store (see store.py)
    DIR/runs/RUN_ID/      one trainer run dir per run
    DIR/jobs/             per-run job file, outcome, lock and log
    DIR/data/             the prepared corpus, when the spec asks the study to prepare it;
                          with a data axis one prepared dir per value, DIR/data/SLUG/
    DIR/slurm/            submitit's folder (SLURM runner)

Everything is validated before the first run starts (spec, matching, data: `check`,
which `study plan` runs too), so bad input is one line and exit 2 with nothing started.
The orchestration itself is stateless: what is done is read back from the store on
every round, so a rerun after a kill continues where the store says the study is.

A study dir is relocatable: nothing in it depends on where it is or how `--out` was
spelled. The store keeps run dirs relative to the study dir, and a run's `data.dir`
is relative to its run dir when the data lives inside the study dir (each run trains
with its run dir as the working directory, see `runner.train_in_process`), absolute
otherwise; so a study dir moved or copied (with its data) resumes where it was.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from rich.console import Console

from sanlab.config import apply_overrides, validate
from sanlab.errors import ConfigError, DataError
from sanlab.fileio import read_json
from sanlab.study.plan import (
    FINAL_STATUSES,
    DataPoint,
    PlannedRun,
    StudyArm,
    build_arms,
    cell_decision,
    cell_key,
    cells,
    data_points,
    final_runs,
    merge,
    sweep_point,
    sweep_results,
    sweep_runs,
    sweeps_at,
)
from sanlab.study.runner import (
    DEFAULT_TRAIN_FN,
    Job,
    LocalRunner,
    OnDone,
    SideTask,
    SideWork,
    SlurmRunner,
    make_runner,
)
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore
from sanlab.study.sweep import SweepDecision
from sanlab.study.table import locks, locks_by_point, print_tables, throughput
from sanlab.tables import Output

SPEC_FILE = "study.json"
RUNS = "runs"  # run dirs: DIR/runs/RUN_ID


def save_spec(spec: StudySpec, study_dir: Path) -> None:
    study_dir.mkdir(parents=True, exist_ok=True)
    (study_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True), indent=2) + "\n")


def load_saved_spec(study_dir: str | Path) -> StudySpec:
    path = Path(study_dir) / SPEC_FILE
    if not path.is_file():
        raise DataError(f"{study_dir} is not a study dir (no {SPEC_FILE}); run `sanlab study run` first")
    data = read_json(path, DataError)
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a study spec")
    return validate(StudySpec, data, source=str(path))


# Keys that only say where and how fast runs execute: a rerun may change them freely.
FREE_KEYS = ("runner",)
# Keys `--extend` may grow (every old value kept, new ones added): each new value only
# adds runs; every other key defines the existing runs and never changes.
EXTENDABLE = ("seeds", "final.tokens", "arms", "matching.arms", "noise.seeds")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flat(v, key) if isinstance(v, dict) and key not in EXTENDABLE else {key: v})
    return out


def _resolved(spec: StudySpec) -> dict[str, Any]:
    """The spec as flat dotted keys, with the values left to defaults resolved (the sweep's
    seed, the noise pair's optimizer, budget and seeds): what the runs are made from."""
    d = spec.model_dump(mode="json")
    d["sweep"]["seed"] = spec.sweep_seed
    d["noise"].update(optimizer=spec.noise_optimizer, tokens=spec.noise_tokens, seeds=spec.noise_seeds)
    return _flat(d)


def spec_changes(old: StudySpec, new: StudySpec) -> tuple[list[str], list[str]]:
    """(keys that change what existing runs are, keys that only add runs) from the study a
    dir was run with (`old`) to `new`: dotted keys in the spec's order; a key whose value
    was implied (e.g. noise.tokens: the largest final budget) says how it moved."""
    a, b = _resolved(old), _resolved(new)
    changed, grown = [], []
    for key in dict.fromkeys([*a, *b]):
        was, now = a.get(key), b.get(key)
        if key.split(".")[0] in FREE_KEYS or was == now:
            continue
        if key in EXTENDABLE and isinstance(was, list) and isinstance(now, list) and all(x in now for x in was):
            grown.append(key)
        elif key in ("sweep.seed", "noise.optimizer", "noise.tokens"):
            changed.append(f"{key} ({was} -> {now}; set {key} = {json.dumps(was)} to keep it)")
        else:
            changed.append(key)
    return changed, grown


def check_same_study(spec: StudySpec, study_dir: Path, *, extend: bool = False) -> None:
    """A study dir runs the study it was made with: another spec (or other overrides) is
    refused, naming the keys, before anything is written. With `extend` the new spec may
    add arms, seeds and budgets (`EXTENDABLE`), never change a run that exists."""
    if not (study_dir / SPEC_FILE).exists():
        return
    old = load_saved_spec(study_dir)
    changed, grown = spec_changes(old, spec)
    if changed:
        raise ConfigError(f"{study_dir} holds study '{old.name}' run with another definition of its runs: "
                          f"{', '.join(changed)} differ from its {SPEC_FILE}; rerun with the spec it was made "
                          "with, or give another --out (--extend adds arms, seeds or budgets only)")
    if grown and not extend:
        raise ConfigError(f"{study_dir} holds study '{old.name}' with fewer {', '.join(grown)} than this spec; "
                          "add --extend to extend it, or give another --out")


def prepare_config(spec: StudySpec, point: DataPoint | None = None) -> Any:
    """The `sanlab prepare` settings the spec asks for (validated like `sanlab prepare`'s),
    at one value of the data axis (`point`)."""
    from sanlab.data.prepare import PrepareConfig  # lazy: numpy; `sanlab study table` runs without it

    corpus, extra = spec.data.corpus, []
    if point is not None and point.axis is not None:
        corpus, extra = point.axis.prepare_settings(point.value, corpus)
    overrides = [f"corpus={corpus}", f"tokens={spec.data.tokens}",
                 f"seq_len={spec.data.seq_len}", f"vocab_size={spec.model.vocab_size}",
                 *spec.data.prepare, *extra]
    source = "data.prepare" if point is None or point.key is None else f"data.axis ({point.label})"
    return apply_overrides(PrepareConfig, {}, overrides, source=source)


def resolve_data(spec: StudySpec, study_dir: Path | None, *, prepare: bool,
                 console: Console | None = None, point: DataPoint) -> Path:
    """The prepared data dir of one data point (`data_points`), preparing it first when the
    spec says how and `prepare`; a dir that already holds a prepared corpus is used as it is."""
    data_dir = Path(point.dir)
    if (data_dir / "manifest.json").is_file():
        _check_data(spec, data_dir)
        return data_dir
    if point.axis is not None and not point.axis.prepares:
        raise DataError(f"data.axis.dir: {data_dir} is not a prepared data dir (no manifest.json)")
    if spec.data.corpus is None and point.axis is None:
        raise DataError(f"data.dir: {data_dir} is not a prepared data dir (no manifest.json); "
                        "run `sanlab prepare` or set data.corpus so the study prepares it")
    cfg = prepare_config(spec, point)
    if prepare:
        from sanlab.data.prepare import prepare as prepare_corpus  # lazy: numpy; `sanlab study table` runs without it

        if console is not None and point.key is not None:
            console.print(f"preparing {point.label} into {data_dir}", highlight=False)
        prepare_corpus(cfg, data_dir, console=console)
        _check_data(spec, data_dir)
    return data_dir


def data_record(point: DataPoint, data_dir: Path, study_dir: Path) -> dict[str, Any]:
    """The store's `data` record of one prepared corpus (see `sanlab.study.store`)."""
    # lazy: numpy; `sanlab study table` runs without it
    from sanlab.data.floor import load_floor
    from sanlab.data.shards import load_manifest

    manifest = load_manifest(data_dir, verify=False)
    floor = load_floor(data_dir)
    d, study = Path(os.path.abspath(data_dir)), Path(os.path.abspath(study_dir))
    where = os.path.relpath(d, study) if study in d.parents else str(d)
    splits = (floor or {}).get("splits") or {}
    return {"type": "data", "data": point.slug, "key": point.key, "value": point.value, "dir": where,
            "corpus": manifest.get("corpus"),
            "train_tokens": ((manifest.get("splits") or {}).get("train") or {}).get("tokens"),
            "floor": {k: (splits.get(k) or {}).get("nats_per_token") for k in ("train", "val")} if floor else None,
            "world": (floor or {}).get("world")}


def _check_data(spec: StudySpec, data_dir: Path) -> None:
    """The prepared rows and vocabulary must be the ones the models are built for."""
    from sanlab.data.shards import load_manifest  # lazy: numpy; `sanlab study table` runs without it

    manifest = load_manifest(data_dir, verify=False)
    if manifest.get("vocab_size") != spec.model.vocab_size:
        raise DataError(f"model.vocab_size={spec.model.vocab_size} but {data_dir} was prepared "
                        f"with vocab_size={manifest.get('vocab_size')}")
    if manifest.get("seq_len") != spec.data.seq_len:
        raise DataError(f"data.seq_len={spec.data.seq_len} but {data_dir} holds rows of "
                        f"seq_len={manifest.get('seq_len')}")


def check(spec: StudySpec, study_dir: Path | None) -> tuple[list[StudyArm], list[DataPoint]]:
    """Everything that can be wrong with the input before any run starts (used by both
    `study run` and `study plan`, so plan accepts exactly what run accepts): the arms and
    every data point's data (prepared, or how to prepare it). Returns the arms and the
    data points (`data_points`, computed once here)."""
    arms = build_arms(spec)
    points = data_points(spec, study_dir)
    for p in points:
        resolve_data(spec, study_dir, prepare=False, point=p)
    return arms, points


def portable_data_dir(data_dir: str | Path, study_dir: Path, run_dir: Path) -> str:
    """`data.dir` as a run of this study records it: relative to the run dir when the data
    is inside the study dir (the pair moves together), else absolute."""
    data, study = Path(os.path.abspath(data_dir)), Path(os.path.abspath(study_dir))
    if data == study or study in data.parents:
        return os.path.relpath(data, os.path.abspath(run_dir))
    return str(data)


def run_costs(runs: Sequence[PlannedRun], records: Mapping[str, dict]) -> list[float]:
    """Each run's cost, by which the local runner starts the longest first: its seconds
    at its arm's tokens/s as measured by the study's finished runs (`throughput`; a group's
    total, which is what a solo run gets); for an arm not measured yet (the noise arm, say),
    the measured arm nearest in FLOPs per token, its tokens/s scaled by the FLOPs ratio;
    with nothing measured (a study's first round), its training FLOPs. FLOPs alone put a
    SAN level with its iso-FLOP partner, which trains faster per FLOP: in the demo's final
    runs that order left one worker idle for the last 8–11 s (by measured seconds, 3–5 s)."""
    speed = throughput(records)
    flops = {r["arm"]: float(r["flops_per_token"]) for r in records.values()
             if r.get("arm") in speed and isinstance(r.get("flops_per_token"), (int, float))
             and r["flops_per_token"] > 0}
    if not flops:
        return [float(r.tokens * r.flops_per_token) for r in runs]
    costs = []
    for r in runs:
        if r.arm in flops:
            costs.append(r.tokens / speed[r.arm])
        elif r.flops_per_token > 0:
            near = min(flops, key=lambda a: abs(math.log(flops[a] / r.flops_per_token)))
            costs.append(r.tokens / (speed[near] * flops[near] / r.flops_per_token))
        else:
            costs.append(0.0)  # (unknown: keeps its place after the known ones)
    return costs


class Study:
    """One `study run` invocation over a study dir."""

    def __init__(self, spec: StudySpec, study_dir: str | Path, *, console: Console | None = None,
                 train_fn: str = DEFAULT_TRAIN_FN,
                 runner: LocalRunner | SlurmRunner | None = None, extend: bool = False,
                 side_work: Callable[[int], list[SideWork]] | None = None) -> None:
        self.spec = spec
        # work for workers the runs leave idle, given the number of arms a group must hold
        # (`study run --report`: `sanlab.report.analyze_job.side_work`, the final pairs' analyses)
        self.side_work = side_work
        self.extend = extend  # the spec may add arms, seeds and budgets to the dir's study
        self.dir = Path(study_dir)
        self.console = console or Output().console
        self.train_fn = train_fn
        self.store = ResultStore(self.dir)
        self.runner = runner or make_runner(spec.runner, self.dir)
        self.attempted: set[str] = set()  # run ids executed by this invocation
        self.announced: set[tuple[str, ...]] = set()  # cell keys whose lock this invocation printed
        self.arms: list[StudyArm] = []
        self.data_dir = ""  # the first (without a data axis: the only) data point's dir
        self.points: list[DataPoint] = []

    # ---------------------------------------------------------------- checks

    def check(self) -> None:
        """Everything that can be wrong with the input, before any run starts."""
        self.arms, self.points = check(self.spec, self.dir)
        self.data_dir = str(Path(self.points[0].dir))

    # ---------------------------------------------------------------- execution

    def _jobs(self, todo: list[PlannedRun], records: Mapping[str, dict]) -> list[Job]:
        return [Job(run_id=r.run_id, run_dir=os.path.abspath(self.dir / RUNS / r.run_id),
                    config=self._run_config(r), jobs_dir=os.path.abspath(self.dir / "jobs"),
                    train_fn=self.train_fn, cost=cost, rank=0 if "sweep" in r.phases else 1)
                for r, cost in zip(todo, run_costs(todo, records))]

    def _execute(self, runs: list[PlannedRun], what: str) -> None:
        records = self.store.runs()
        todo = [r for r in runs if records.get(r.run_id, {}).get("status") not in FINAL_STATUSES]
        left = {r.run_id for r in todo}
        # (finished before this invocation: a stream may have run some of them already)
        skipped = len([r for r in runs if r.run_id not in left and r.run_id not in self.attempted])
        if skipped:
            self.console.print(f"{what}: {skipped} run(s) already finished, skipped")
        if not todo:
            return
        self.console.print(f"{what}: {len(todo)} run(s)")
        on_done, _ = self._recorder(todo)
        self.runner.run(self._jobs(todo, records), on_done)

    def _recorder(self, todo: list[PlannedRun]) -> tuple[OnDone, Callable[[list[PlannedRun]], None]]:
        """(the callback that records each finished run and prints its line, [k/N] with N the
        runs of `todo`; a function that adds runs to `todo`, as a stream starts them)."""
        by_id = {r.run_id: r for r in todo}
        count = [0]

        def on_done(job: Job, outcome: dict[str, Any]) -> None:
            r = by_id[job.run_id]
            self.attempted.add(r.run_id)
            self.store.append({
                "type": "run", "run_id": r.run_id, "phases": r.phases, "arm": r.arm,
                "kind": r.kind, "optimizer": r.optimizer, "multiplier": r.multiplier, "lr": r.lr,
                "seed": r.seed, "tokens": r.tokens, "params": r.params_total,
                "params_non_embedding": r.params_non_embedding,
                "flops_per_token": r.flops_per_token, "run_dir": f"{RUNS}/{r.run_id}",
                "config": job.config, **({"data": r.data, "data_value": r.data_value} if r.data else {}),
                **outcome,
            })
            count[0] += 1
            val = (outcome.get("final") or {}).get("val_loss")
            loss = f"val_loss {val:.4f}" if isinstance(val, (int, float)) else ""
            err = f" — {outcome['error']}" if outcome.get("error") else ""
            self.console.print(f"  [{count[0]}/{len(todo)}] {r.run_id}: {outcome['status']} {loss} "
                               f"({outcome.get('wall_s', 0):.0f} s){err}", highlight=False)

        def add(runs: list[PlannedRun]) -> None:
            todo.extend(runs)
            by_id.update({r.run_id: r for r in runs})

        return on_done, add

    def _run_config(self, r: PlannedRun) -> dict[str, Any]:
        config: dict[str, Any] = json.loads(r.config.model_dump_json())
        config["data"]["dir"] = portable_data_dir(config["data"]["dir"], self.dir, self.dir / RUNS / r.run_id)
        return config

    def _decisions(self, records: Mapping[str, dict]) -> Iterator[tuple[DataPoint, StudyArm, str, SweepDecision]]:
        """What the sweep of each cell of each data point that sweeps does next, given the
        store (a failed point counts as a bad one once this invocation has retried it)."""
        for point in self.points:
            if not sweeps_at(self.spec, self.points, point):
                continue
            for arm, opt in cells(self.spec, self.arms):
                yield point, arm, opt, cell_decision(
                    self.spec, sweep_results(self.spec, arm, opt, records, self.attempted, point.slug))

    def _stuck(self, stuck: list[str]) -> DataError:
        """The error for sweep points the store holds as finished runs but not as this sweep's
        points (a record of another phase or budget under their ids): the sweep would plan
        them again, forever."""
        return DataError(f"{self.store.path}: the sweep needs {', '.join(stuck[:3])}"
                         f"{' …' if len(stuck) > 3 else ''}, which the store holds as finished runs "
                         "but not as sweep points of this spec (a results.jsonl edited, or written by "
                         "another spec); move the study dir aside and run the study afresh")

    def _sweep(self) -> None:
        """Rounds of sweep points until every cell (of every data point that sweeps) has
        locked its LR; the points' sweeps run side by side, round by round."""
        round_no = 0
        while True:
            records = self.store.runs()
            note = "boundary extension" if round_no else ""
            batch = merge(r for point, arm, opt, d in self._decisions(records) if not d.done
                          for r in sweep_runs(self.spec, arm, opt, d.pending, point.dir, note=note, point=point))
            if not batch:
                return
            stuck = [r.run_id for r in batch if records.get(r.run_id, {}).get("status") in FINAL_STATUSES]
            if len(stuck) == len(batch):
                raise self._stuck(stuck)
            round_no += 1
            self._execute(batch, f"sweep round {round_no}")

    def _stream(self) -> None:
        """The sweep and the final runs as one stream, on a runner that takes jobs while it
        runs (the local one): a cell's next sweep points start as soon as its last ones
        have finished, and its final runs (with the noise pair, for the reference) as soon
        as it locks, instead of every cell waiting for the slowest cell's round and the
        final runs for the last lock. The same runs, decisions and locks as by rounds
        (each cell's sweep reads only its own points); free workers take sweep points
        before final runs, since those decide what runs next."""
        spec = self.spec
        started: set[str] = set()

        def wanted() -> list[PlannedRun]:
            records = self.store.runs()
            runs: list[PlannedRun] = []
            for point, arm, opt, d in self._decisions(records):
                for m in d.pending:
                    note = "" if m in spec.sweep.multipliers else "boundary extension"
                    runs += sweep_runs(spec, arm, opt, [m], point.dir, note=note, point=point)
            by_point = locks_by_point(spec, self.arms, records, self.attempted, self.points)
            if spec.sweep.enabled:
                self._announce_locks(by_point, records, self.attempted)
            for p in self.points:
                runs += final_runs(spec, self.arms, by_point[p.slug], p.dir, point=p if p.key is not None else None)
            new = [r for r in merge(runs) if r.run_id not in started
                   and records.get(r.run_id, {}).get("status") not in FINAL_STATUSES]
            started.update(r.run_id for r in new)
            return new

        def header(runs: list[PlannedRun], more: bool) -> None:
            sweep = [r for r in runs if "sweep" in r.phases]
            finals = [r for r in runs if "sweep" not in r.phases]
            if sweep:
                what = "sweep, boundary extension" if more else "sweep"
                self.console.print(f"{what}: {len(sweep)} run(s)"
                                   + (f" ({', '.join(sorted({f'{r.arm} {r.optimizer}' for r in sweep}))})"
                                      if more else ""), highlight=False)
            if finals:
                self.console.print(f"final + noise-floor runs: {len(finals)} run(s)"
                                   + (f" ({', '.join(sorted({f'{r.arm} {r.optimizer}' for r in finals}))})"
                                      if more else ""), highlight=False)

        first = wanted()
        if not first:
            self._check_not_stuck()
            return
        header(first, False)
        on_done, add = self._recorder(first)

        def more() -> list[Job]:
            new = wanted()
            if not new:
                return []
            header(new, True)
            add(new)
            return self._jobs(new, self.store.runs())

        idle = self._idle_tasks()
        self.runner.run(self._jobs(first, self.store.runs()), on_done, more=more,  # type: ignore[call-arg]
                        **({"idle": idle} if idle is not None else {}))
        self._check_not_stuck()

    def _idle_tasks(self) -> Callable[[int], list[SideTask]] | None:
        """With `side_work`, on a CPU local runner: the side tasks (`runner.SideTask`) it
        names for groups of every arm (`study run --report`: each final pair group's
        analysis once all its final runs have completed), each started once."""
        if self.side_work is None or not isinstance(self.runner, LocalRunner) or self.runner.gpus:
            return None
        started: set[str] = set()
        side_work = self.side_work

        def idle(free: int) -> list[SideTask]:
            tasks = []
            for w in side_work(len(self.arms) - 1):
                if w.name in started or len(tasks) == free:
                    continue
                started.add(w.name)
                log = self.dir / "jobs" / f"{w.name}.log"

                def done(rc: int, w: SideWork = w, log: Path = log) -> None:
                    self.console.print(f"{w.done} (on an idle worker)" if rc == 0 else
                                       f"{w.failed} (on an idle worker: exit {rc}, see {log})", highlight=False)

                tasks.append(SideTask(w.name, w.module, w.argv, log, done))
            return tasks

        return idle

    def _check_not_stuck(self) -> None:
        """After a stream: a cell whose sweep still wants points that the store holds as
        finished runs (not as its sweep points) can never lock (see `_sweep`)."""
        records = self.store.runs()
        stuck = [r.run_id for point, arm, opt, d in self._decisions(records)
                 for r in sweep_runs(self.spec, arm, opt, d.pending, point.dir, point=point)
                 if records.get(r.run_id, {}).get("status") in FINAL_STATUSES]
        if stuck:
            raise self._stuck(stuck)

    def _announce_locks(self, by_point: Mapping[str, Mapping[tuple[str, str], float]],
                        records: Mapping[str, dict], attempted: set[str], last: bool = False) -> None:
        """Store and print the lock of every cell that has locked and was not announced yet
        (`last`, once the sweep is over: and say which cells have none). Without a sweep
        (`sweep.enabled = false`) nothing locks and nothing is stored (`_announce_base_lrs`)."""
        if not self.spec.sweep.enabled:
            return
        for point in self.points:
            if sweep_point(self.spec, self.points, point) != point:
                continue
            lock = by_point[point.slug]
            stored = self.store.locks(point.slug)
            at = f" at {point.label}" if point.key is not None else ""
            for arm, opt in cells(self.spec, self.arms):
                key = (arm.name, opt)
                if key not in lock and last:
                    self.console.print(f"[red]{arm.name} {opt}{at}: every sweep point failed; no final runs[/red]")
                if key not in lock or cell_key(point.slug, *key) in self.announced:
                    continue
                self.announced.add(cell_key(point.slug, *key))
                results = sweep_results(self.spec, arm, opt, records, attempted, point.slug)
                d = cell_decision(self.spec, results)
                if stored.get(key, {}).get("lr") != lock[key]:
                    self.store.append({"type": "lock", "arm": arm.name, "optimizer": opt,
                                       "multiplier": d.best, "lr": lock[key], "at_edge": d.at_edge,
                                       "losses": {str(k): v for k, v in results.items()},
                                       **({"data": point.slug} if point.slug else {})})
                self.console.print(f"lock {arm.name} {opt}{at}: lr {lock[key]:g}"
                                   + (" (still at an edge of the sweep)" if d.at_edge else ""), highlight=False)

    def _announce_base_lrs(self) -> None:
        """Without a sweep, one line before any run: every cell's LR is its base LR."""
        lock = locks(self.spec, self.arms, {}, set())
        lrs = ", ".join(f"{arm} {opt} {lr:g}" for (arm, opt), lr in lock.items())
        self.console.print(f"no LR sweep (sweep.enabled = false): every cell trains at its base LR: {lrs}",
                           highlight=False)

    def _record_locks(self) -> dict[str, dict[tuple[str, str], float]]:
        """Data slug -> the locks its final runs train at (its own sweep's, or `sweep.lock_at`'s)."""
        records = self.store.runs()
        by_point = locks_by_point(self.spec, self.arms, records, set(records), self.points)
        self._announce_locks(by_point, records, set(records), last=True)
        return by_point

    def _prepare(self) -> None:
        """Every data point's prepared dir (each prepared once, then reused), and its
        `data` record in the store when the store does not hold that one yet."""
        stored = self.store.data()
        for point in self.points:
            d = resolve_data(self.spec, self.dir, prepare=True, console=self.console, point=point)
            rec = data_record(point, d, self.dir)
            old = {k: v for k, v in stored.get(point.slug, {}).items() if k != "time"}
            if old != rec:
                self.store.append(rec)

    def run(self) -> int:
        """The whole study; returns 0 when every run finished (completed or diverged)."""
        try:
            return self._run()
        finally:
            close = getattr(self.runner, "close", None)  # (the local runner's warm processes)
            if close is not None:
                close()

    def _run(self) -> int:
        self.check()
        check_same_study(self.spec, self.dir, extend=self.extend)
        note = self.store.repair()
        if note:
            self.console.print(f"note: {note}", highlight=False)
        save_spec(self.spec, self.dir)
        warm_up = getattr(self.runner, "warm_up", None)
        if warm_up is not None:  # (the local runner's warm processes import while the data is prepared)
            warm_up()
        self._prepare()
        if not self.spec.sweep.enabled:
            self._announce_base_lrs()
        if getattr(self.runner, "streams", False):
            self._stream()
        elif self.spec.sweep.enabled:
            self._sweep()
        by_point = self._record_locks()
        finals = merge([r for p in self.points
                        for r in final_runs(self.spec, self.arms, by_point[p.slug], p.dir,
                                            point=p if p.key is not None else None)])
        self._execute(finals, "final + noise-floor runs")
        records = self.store.runs()
        print_tables(self.spec, self.arms, records, self.points, Output.to_console(self.console), self.store.data())
        bad = sorted(rid for rid in self.attempted if records[rid].get("status") not in FINAL_STATUSES)
        if bad:
            self.console.print(f"[red]{len(bad)} run(s) did not finish: {', '.join(bad)} "
                               "(rerun `sanlab study run` to retry / resume them)[/red]")
            return 1
        return 0

