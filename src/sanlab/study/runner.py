"""Where a study's runs execute: local worker processes or SLURM through submitit.

Every run goes through `execute(job)`, wherever it runs:

1. it takes an exclusive `flock` on the run's lock file, so a run left going by a
   killed study (or a second `study run` on the same dir) is never trained by two
   processes at once — the later one waits and then finds it finished;
2. it calls the trainer with `resume=True`, which returns a finished run as it is,
   continues an interrupted one from its checkpoint and starts a new one otherwise;
3. a run needing several GPUs is started through `torchrun`, whose ranks run this
   module's entry point and train in-process;
4. whatever happens, it returns an outcome dict (`status`, `final`, `error`, …) — a
   failing run is an outcome, not an exception, so the study goes on.

Runners:
- `LocalRunner`: `workers` concurrent runs, each in its own Python process
  (`python -m sanlab.study.runner JOB OUT`, one run per process, so a crash or an
  out-of-memory kill takes down only that run) with the CPU threads split between
  them; on the CPU each worker forks its runs from a warm process that has imported
  torch and sanlab once (`sanlab.study.warm`). Children ask the kernel for SIGTERM when
  their parent dies (`PR_SET_PDEATHSIG`: a run its warm process or the study, a warm
  process the study), so killing the study also stops its runs, which save a
  checkpoint on SIGTERM and resume on the next `study run`; on Ctrl-C the queued runs
  never start. Runs that can train as the
  members of one batched model (an arm's sweep points and seeds; `runner.members`) are
  grouped, one group per process (`sanlab.study.groups`); each member still writes its own
  run dir and outcome.
- `SlurmRunner`: one submitit job per run (`cluster="local"` runs the same path on
  this machine through submitit's local executor).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import subprocess
import sys
import time
import traceback
import weakref
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from sanlab.config import Config, validate
from sanlab.study import warm
from sanlab.study.groups import DEFAULT_TRAIN_FN, groupable, plan_groups, resolve
from sanlab.study.spec import RunnerSpec

OnDone = Callable[["Job", dict[str, Any]], None]
More = Callable[[], Sequence["Job"]]


@dataclass(frozen=True)
class SideTask:
    """A process the local runner starts on a worker that no job is waiting for (a study:
    the analysis of final runs that have finished, `sanlab.report.analyze_job`): `module`'s
    `main(argv)` with its output to `log_file`; `on_done(exit code)` in the runner's thread."""

    name: str
    module: str
    argv: tuple[str, ...]
    log_file: Path
    on_done: Callable[[int], None]


Idle = Callable[[int], Sequence[SideTask]]  # free workers -> side tasks to start on them now


class SideWork(NamedTuple):
    """A side task as a layer above the study names it (`Study(side_work=...)`): its name
    (its log: jobs/NAME.log), `module`'s `main(argv)`, and what the study prints when it
    has succeeded (`done`) or failed (`failed`)."""

    name: str
    module: str
    argv: tuple[str, ...]
    done: str
    failed: str


@dataclass(frozen=True)
class Job:
    """Everything a worker needs, as plain JSON data (it crosses process and SLURM boundaries)."""

    run_id: str
    run_dir: str
    config: dict[str, Any]
    jobs_dir: str  # job files, outcome files, lock files and logs of the study
    threads: int | None = None  # torch threads for this run (CPU)
    gpus: int = 0  # >1: torchrun with one process per GPU
    nodes: int = 1
    train_fn: str = DEFAULT_TRAIN_FN  # "module:function" with the trainer's signature
    # its estimated seconds, or its training FLOPs (`orchestrate.run_costs`), or 0 if
    # unknown: the local runner starts the costliest first
    cost: float = 0.0
    # the local runner starts a lower rank first, whatever the costs (a study: its sweep
    # points, which decide what runs next, 0; its final runs 1)
    rank: int = 0

    @property
    def job_file(self) -> Path:
        return Path(self.jobs_dir) / f"{self.run_id}.json"

    @property
    def outcome_file(self) -> Path:
        return Path(self.jobs_dir) / f"{self.run_id}.outcome.json"

    @property
    def lock_file(self) -> Path:
        return Path(self.jobs_dir) / f"{self.run_id}.lock"

    @property
    def log_file(self) -> Path:
        return Path(self.jobs_dir) / f"{self.run_id}.log"

    def write(self) -> None:
        Path(self.jobs_dir).mkdir(parents=True, exist_ok=True)
        _write_json(self.job_file, asdict(self))

    @classmethod
    def read(cls, path: str | Path) -> "Job":
        return cls(**json.loads(Path(path).read_text()))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _failed(error: str) -> dict[str, Any]:
    return {"status": "failed", "final": {}, "error": error}


# --------------------------------------------------------------------------- one run


def train_in_process(job: Job) -> dict[str, Any]:
    """Train (or return / resume) one run in this process; never raises.

    The run trains with its run dir as the working directory, so a relative `data.dir`
    in its config (the study's own data, `../../data`) means the same wherever the
    study dir is (see `orchestrate.portable_data_dir`).
    """
    t0 = time.time()
    if job.threads:
        # Read by torch when it starts its thread pool; set directly if it already has.
        os.environ["OMP_NUM_THREADS"] = str(job.threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(job.threads)
    try:
        cfg = validate(Config, job.config, source=f"run {job.run_id}")
        run_dir = Path(job.run_dir).absolute()
        run_dir.mkdir(parents=True, exist_ok=True)
        cwd = os.getcwd()
        os.chdir(run_dir)
        try:
            meta = resolve(job.train_fn)(cfg, run_dir, resume=True)
        finally:
            os.chdir(cwd)
    except Exception as e:  # a crashing run is a recorded outcome; the study goes on
        traceback.print_exc()
        return {**_failed(f"{type(e).__name__}: {e}"), "wall_s": time.time() - t0}
    meta = dict(meta or {})
    return {
        "status": meta.get("status", "failed"),
        "final": meta.get("final") or {},
        "error": meta.get("error"),
        "accounting": meta.get("accounting"),
        "tokens_per_s": meta.get("tokens_per_s"),
        "wall_s": time.time() - t0,
    }


def _torchrun(job: Job) -> dict[str, Any]:
    """Start a multi-GPU run through torchrun; its ranks run `main` on the job file."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={job.gpus}"]
    if job.nodes > 1:
        import submitit

        env = submitit.JobEnvironment()
        cmd += [f"--nnodes={job.nodes}", f"--node-rank={env.node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={env.hostnames[0]}:29500", f"--rdzv-id={job.run_id}"]
    else:
        cmd += ["--standalone"]
    cmd += ["-m", "sanlab.study.runner", str(job.job_file), str(job.outcome_file)]
    job.outcome_file.unlink(missing_ok=True)
    rc = subprocess.run(cmd).returncode
    if job.outcome_file.is_file():
        return json.loads(job.outcome_file.read_text())  # type: ignore[no-any-return]
    return _failed(f"torchrun exited with code {rc} (see {job.log_file})")


def execute(job: Job) -> dict[str, Any]:
    """Run one job under its lock (see the module docstring); never raises."""
    job.write()
    if job.nodes > 1 and os.environ.get("SLURM_NODEID", "0") != "0":
        return _torchrun(job)  # only the first node holds the lock and reports
    with open(job.lock_file, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for a run left going by a killed study
        if job.gpus > 1:
            return _torchrun(job)
        return train_in_process(job)


# --------------------------------------------------------------------------- runners


class LocalRunner:
    """`workers` concurrent runs on this machine, each in its own process."""

    streams = True  # `run` takes more jobs while it runs (`more`)

    def __init__(self, spec: RunnerSpec) -> None:
        self.workers = spec.workers
        self.threads = spec.threads or max(1, (os.cpu_count() or 1) // spec.workers)
        self.gpus = spec.gpus_per_run
        self.members = spec.members  # runs trained as members of one model (sanlab.study.groups)
        self._warm: queue.Queue[warm.WarmWorker] | None = None  # from the first `run` to `close`
        # Each worker owns a fixed set of GPUs: worker i sees devices i·g … i·g + g − 1.
        self.gpu_slots: queue.Queue[str] = queue.Queue()
        for w in range(self.workers if self.gpus else 0):
            self.gpu_slots.put(",".join(str(w * self.gpus + g) for g in range(self.gpus)))

    def _launch(self, module: str, argv: list[str], log_file: Path, env: dict[str, str]) -> int:
        """The exit code of `python -m module argv` (its output appended to log_file, `env`
        added to this process's environment): forked from a warm process where one is
        free and able (`sanlab.study.warm`), else started as a new process."""
        try:
            worker = None if self._warm is None else self._warm.get_nowait()
        except queue.Empty:  # (fewer warm processes than workers started)
            worker = None
        try:
            rc = None if worker is None else worker.run(module, argv, log_file, env)
        finally:
            if worker is not None:
                self._warm.put(worker)  # type: ignore[union-attr]
        if rc is not None:
            return rc
        with open(log_file, "a") as log:
            return subprocess.run([sys.executable, "-m", module, *argv], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env, "SANLAB_PARENT_PID": str(os.getpid())}).returncode

    def _one(self, job: Job) -> dict[str, Any]:
        job.write()
        job.outcome_file.unlink(missing_ok=True)
        env = {"OMP_NUM_THREADS": str(self.threads)}
        slot = self.gpu_slots.get() if self.gpus else None
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        try:
            rc = self._launch("sanlab.study.runner", [str(job.job_file), str(job.outcome_file)], job.log_file, env)
        finally:
            if slot is not None:
                self.gpu_slots.put(slot)
        if job.outcome_file.is_file():
            return json.loads(job.outcome_file.read_text())  # type: ignore[no-any-return]
        return _failed(f"worker exited with code {rc} (see {job.log_file})")

    def _side(self, task: SideTask) -> int:
        """A side task's exit code (its process forked from a warm one where one is free);
        126 when it cannot start (its log cannot be written): a side task never stops the runs."""
        try:
            task.log_file.parent.mkdir(parents=True, exist_ok=True)
            return self._launch(task.module, list(task.argv), task.log_file, {"OMP_NUM_THREADS": str(self.threads)})
        except OSError:
            return 126

    def _group(self, jobs: list[Job]) -> list[dict[str, Any]]:
        """Jobs trained as the members of one model in one worker process (`sanlab.study.groups`)."""
        for job in jobs:
            job.write()
            job.outcome_file.unlink(missing_ok=True)
        group_file = Path(jobs[0].jobs_dir) / f"{jobs[0].run_id}.group.json"
        _write_json(group_file, {"jobs": [asdict(j) for j in jobs]})
        for job in jobs[1:]:
            with open(job.log_file, "a") as log:
                log.write(f"trained as a member of a group of {len(jobs)}; its log: {jobs[0].log_file}\n")
        rc = self._launch("sanlab.study.groups", [str(group_file)], jobs[0].log_file,
                          {"OMP_NUM_THREADS": str(self.threads)})
        return [json.loads(j.outcome_file.read_text()) if j.outcome_file.is_file()
                else _failed(f"worker exited with code {rc} (see {jobs[0].log_file})") for j in jobs]

    def _groups(self, jobs: list[Job], balance: bool = False) -> list[list[Job]]:
        """The jobs as groups of members (`sanlab.study.groups.plan_groups`), each group of
        one train_fn that can train members (`groupable`); CPU runs only. `balance`: the
        jobs start on idle workers, so groups are cut where their costs say that ends the
        batch sooner (`sanlab.study.groups.balance`)."""
        if self.members == 1 or self.gpus:
            return [[j] for j in jobs]
        by_fn: dict[str, list[Job]] = {}
        for j in jobs:
            by_fn.setdefault(j.train_fn, []).append(j)
        groups: list[list[Job]] = []
        for fn, same in by_fn.items():
            if not groupable(fn):
                groups += [[j] for j in same]
                continue
            groups += [[same[i] for i in g] for g in plan_groups([j.config for j in same], self.members, self.workers,
                                                                 [j.cost for j in same] if balance else None)]
        return groups

    def run(self, jobs: Sequence[Job], on_done: OnDone, more: More | None = None, idle: Idle | None = None) -> None:
        """Run every job, calling `on_done(job, outcome)` in this thread as each finishes
        (the members of a group as their group finishes). `more`, called in this thread
        after each finished group's `on_done`, returns jobs to run as well (a study's next
        sweep points, the final runs of a cell that locked); they are grouped among
        themselves. A free worker takes the waiting group of the lowest rank, then the
        costliest. `idle(free workers)`, called in this thread whenever workers are free and
        no job waits, returns side tasks to start on them (`SideTask`); `run` returns once
        the jobs and the side tasks have all finished."""

        def one(group: list[Job]) -> list[dict[str, Any]]:
            return [self._one(group[0])] if len(group) == 1 else self._group(group)

        waiting: list[list[Job]] = []

        def add(new: Sequence[Job], first: bool = False) -> None:
            own = [Job(**{**asdict(j), "threads": j.threads or self.threads, "gpus": self.gpus}) for j in new]
            waiting.extend(self._groups(own, balance=first))
            # longest first (as `study plan`'s estimate assumes, `plan.makespan`): a long run
            # started last would keep one worker busy while the others wait for it (a stable
            # sort: runs of unknown cost keep their order)
            waiting.sort(key=lambda g: (min(j.rank for j in g), -sum(j.cost for j in g)))

        add(jobs, first=True)
        self._start_warm()
        pool = ThreadPoolExecutor(max_workers=self.workers)
        try:
            running: dict[Future[Any], list[Job] | SideTask] = {}
            while True:
                while waiting and len(running) < self.workers:
                    group = waiting.pop(0)
                    running[pool.submit(one, group)] = group
                if idle is not None and not waiting and len(running) < self.workers:
                    for task in list(idle(self.workers - len(running)))[:self.workers - len(running)]:
                        running[pool.submit(self._side, task)] = task
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    what = running.pop(fut)
                    if isinstance(what, SideTask):
                        what.on_done(fut.result())
                        continue
                    for job, outcome in zip(what, fut.result()):
                        on_done(job, outcome)
                if more is not None:
                    add(more())
        except BaseException:
            # Ctrl-C (KeyboardInterrupt) reaches the running runs too, one process group:
            # they stop at their next step with a checkpoint, and the runs still waiting
            # never start (the pool only ever holds running ones)
            pool.shutdown(wait=True)
            raise
        pool.shutdown(wait=True)

    def warm_up(self) -> None:
        """Start the warm processes now (a study calls this before it prepares its data, so
        their imports overlap the preparation); `run` starts them otherwise."""
        self._start_warm()

    def _start_warm(self) -> None:
        """One warm process a worker (`sanlab.study.warm`; CPU runs only), started by
        `warm_up` or the first `run` so their imports overlap, and kept for the next (a
        study's sweep rounds and final runs) until `close`; `_launch` settles whether each
        can fork runs."""
        if self._warm is not None or self.gpus or not warm.enabled():
            return
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "SANLAB_PARENT_PID": str(os.getpid())}
        self._warm = queue.Queue()
        for _ in range(self.workers):
            try:
                self._warm.put(warm.WarmWorker(env))
            except OSError:
                break
        # (stopped by `close`, or when this runner is collected or the interpreter exits)
        self._stop_warm = weakref.finalize(self, _close_all, self._warm)

    def close(self) -> None:
        """Stop the warm processes (they also end with this process)."""
        if self._warm is not None:
            self._stop_warm()
            self._warm = None


def _close_all(workers: queue.Queue[warm.WarmWorker]) -> None:
    while not workers.empty():
        workers.get().close()


class SlurmRunner:
    """One submitit job per run: sbatch on a cluster, or submitit's local executor."""

    def __init__(self, spec: RunnerSpec, folder: str | Path) -> None:
        import submitit

        s = spec.slurm
        self.executor = submitit.AutoExecutor(folder=str(folder), cluster="local" if s.local else None)
        params: dict[str, Any] = {
            "timeout_min": s.time_min, "nodes": s.nodes, "tasks_per_node": 1,
            "cpus_per_task": s.cpus_per_task, "name": "sanlab",
        }
        if spec.gpus_per_run:
            params["gpus_per_node"] = spec.gpus_per_run
        if s.mem_gb is not None:
            params["mem_gb"] = s.mem_gb
        if not s.local:
            params["slurm_array_parallelism"] = s.array_parallelism
            for key in ("partition", "account", "qos", "constraint"):
                if getattr(s, key) is not None:
                    params[f"slurm_{key}"] = getattr(s, key)
        self.executor.update_parameters(**params)
        self.threads = spec.threads
        self.gpus, self.nodes = spec.gpus_per_run, s.nodes

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> None:
        import submitit

        jobs = [Job(**{**asdict(j), "threads": j.threads or self.threads, "gpus": self.gpus,
                       "nodes": self.nodes}) for j in jobs]
        with self.executor.batch():
            submitted = [self.executor.submit(execute, j) for j in jobs]
        by_id = {s.job_id: j for s, j in zip(submitted, jobs)}
        for s in submitit.helpers.as_completed(submitted):
            try:
                outcome = s.result()
            except Exception as e:  # the job itself died (timeout, preemption, node failure)
                outcome = _failed(f"slurm job {s.job_id}: {type(e).__name__}: {str(e).splitlines()[0]}")
            on_done(by_id[s.job_id], outcome)

    def close(self) -> None:
        """(Nothing to stop: `LocalRunner.close`'s counterpart.)"""


def make_runner(spec: RunnerSpec, study_dir: str | Path) -> LocalRunner | SlurmRunner:
    if spec.kind == "slurm":
        return SlurmRunner(spec, Path(study_dir) / "slurm")
    return LocalRunner(spec)


# --------------------------------------------------------------------------- worker entry


def main(argv: Sequence[str]) -> int:
    """`python -m sanlab.study.runner JOB.json OUTCOME.json`: one run in this process.

    Started by `LocalRunner` (then it takes the lock and may start torchrun) or as a
    torchrun rank (RANK in the environment: train in-process; rank 0 reports).
    """
    job_file, outcome_file = Path(argv[0]), Path(argv[1])
    job = Job.read(job_file)
    if "RANK" in os.environ:
        outcome = train_in_process(job)
        if os.environ["RANK"] != "0":
            return 0
    else:
        parent = os.environ.get("SANLAB_PARENT_PID")
        warm.die_with_parent()
        if parent is not None and os.getppid() != int(parent):
            return 1  # the study died before the death signal was armed
        outcome = execute(job)
    _write_json(outcome_file, outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
