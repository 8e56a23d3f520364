"""Measured speed of a study's arms, for the time estimate of `study plan`.

Scaling one throughput by FLOPs per token is wrong for exactly the arms a study is
about: a deep attention-only stack spends time in softmax, masking, norms and small
products that carry few counted FLOPs (measured: the SAN runs ~1.7x slower than
its FLOP ratio on a CPU). So the estimate times the real training step of every
distinct arm shape on this machine instead:

- one child process (`python -m sanlab.study.speed`) with the thread count a run of
  the study gets, started the way a worker starts: its time to be ready to train is
  the per-run start-up cost;
- per distinct (model, batch, precision) shape: building the model and optimizers, a
  warm-up step and `steps` timed training steps (forward with the fused loss, backward,
  clip, optimizer step: the trainer's step on synthetic tokens), one timed evaluation
  pass and one checkpoint written as the trainer writes it.

Results are cached in the study dir (`speed.json`) under a key of everything that
changes the step's cost (model, batch split, seq_len, precision, device, threads,
versions, the compiled kernels), so a second `study plan` or `study run` does not time them again. Arms
whose step would be too large to time here (a GPU-scale spec planned on a laptop) are
left to the FLOP-scaled estimate, and the plan says so.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from sanlab import __version__
from sanlab.config import Config
from sanlab.fileio import try_read_json_object
from sanlab.model import native
from sanlab.train.host import tune_cpu_allocator

SPEED_FILE = "speed.json"
# Steps above this many training FLOPs are not timed by `study plan` (about a minute
# on a laptop CPU); their estimate scales `runner.tokens_per_s` by FLOPs instead.
MAX_TIMED_STEP_FLOPS = 5e12


def local_threads(runner: Any) -> int:
    """Torch threads a local worker's run gets (as `sanlab.study.runner.LocalRunner`)."""
    return runner.threads or max(1, (os.cpu_count() or 1) // runner.workers)


def torch_version() -> str:
    """torch's version, from its package metadata where it is installed as a package (no
    import: a study's process and `study plan` run without torch), else `torch.__version__`."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        # lazy: torch, only where its metadata is missing (a source tree on the path)
        import torch

        return str(torch.__version__)


def shape_key(cfg: Mapping[str, Any], threads: int, side_by_side: int = 1) -> str:
    """What decides a step's cost: model, rows and their split, seq_len, precision,
    device, threads, how many runs share the machine, the software versions and, on the
    CPU, the compiled kernels (not LR, seed or length)."""
    t = cfg["train"]
    parts = {"model": cfg["model"], "seq_len": cfg["data"]["seq_len"], "batch_rows": t["batch_rows"],
             "micro_batch_rows": t.get("micro_batch_rows"), "precision": t.get("precision"),
             "device": t.get("device"), "compile": t.get("compile"), "eval_rows": t.get("eval_rows"),
             "freeze": t.get("freeze"), "optimizer": cfg["optim"]["name"],
             "ns_precision": cfg["optim"].get("ns_precision"), "threads": threads,
             "side_by_side": side_by_side,
             "versions": [__version__, torch_version()],
             "kernels": native.identity() if t.get("device") != "cuda" else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _time_config(cfg_data: dict[str, Any], steps: int) -> dict[str, float]:
    """Seconds per training step and per evaluation pass of one config, in this process."""
    # lazy: torch; `sanlab study` imports this module, only the timing child trains
    import torch

    from sanlab.model.lm import LM
    from sanlab.train import checkpoint
    from sanlab.train.optim import build_optimizers, clip_grad_norm
    from sanlab.train.trainer import make_plan, resolve

    cfg = resolve(Config.model_validate(cfg_data))
    t, T = cfg.train, cfg.data.seq_len
    plan = make_plan(cfg.model_copy(update={"train": t.model_copy(update={"tokens": None, "steps": 1})}), 1)
    device = torch.device(t.device)
    torch.manual_seed(0)
    t_setup = time.perf_counter()
    model = LM(cfg.model).to(device)
    # state a mixer takes from the data (FixedSeqQK's sequence): the timing does not depend
    # on its values, so stand-in ids; a row length a mixer cannot serve is refused here too
    model.bind_data(lambda n: torch.full((n,), 8 % cfg.model.vocab_size, dtype=torch.long), T)
    optims = build_optimizers(model, cfg.optim)
    setup_s = time.perf_counter() - t_setup
    if t.compile:  # as the trainer compiles (masks built before the compiled layers; eager on a failure)
        model.compile_layers(lambda line: print(line, file=sys.stderr))
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, cfg.model.vocab_size, (plan.micro_rows, T + 1), generator=g).to(device)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    seg = torch.zeros_like(inputs)
    mask = torch.ones_like(inputs, dtype=torch.bool)
    bf16 = t.precision == "bf16"

    def amp() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_step() -> None:
        for _ in range(plan.accum):
            with amp():
                loss, _ = model(inputs, seg, targets, mask, t.z_loss)
            (loss / plan.accum).backward()
        clip_grad_norm(optims.params(), cfg.optim.grad_clip)
        optims.step()
        optims.zero_grad()

    train_step()  # warm-up: allocations, kernel selection, compilation
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step()
    sync()
    step_s = (time.perf_counter() - t0) / steps
    eval_passes = max(1, -(-t.eval_rows // plan.micro_rows))
    t0 = time.perf_counter()
    with torch.no_grad():
        model.eval()
        for _ in range(eval_passes):
            with amp():
                model(inputs, seg)
    sync()
    eval_s = time.perf_counter() - t0
    # one checkpoint as the trainer writes it (model, optimizer state, run state), with the
    # optimizer state the timed steps created
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        checkpoint.save(Path(tmp) / "latest", model, optims, {"step": steps, "config": cfg_data})
        save_s = time.perf_counter() - t0
    return {"step_s": step_s, "eval_s": eval_s, "setup_s": setup_s, "save_s": save_s,
            "tokens_per_s": plan.tokens_per_step / step_s}


def _child(request: dict[str, Any], go: Any = None) -> dict[str, Any]:
    """The measuring process: ready time, then (after `go()`, when the other measuring
    processes are ready too) each config in turn."""
    # lazy: torch; `sanlab study` imports this module, only the timing child trains
    import torch

    from sanlab.model.lm import LM
    from sanlab.train.optim import build_optimizers
    from sanlab.train.trainer import resolve  # a worker imports the trainer before it trains

    threads = request["threads"]
    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()  # as `sanlab train` does on the CPU
    configs = list(request["configs"].items())
    if configs:  # a worker's first model and optimizers carry one-time costs (~1 s on a CPU:
        # lazy imports, first kernels): part of every run's start-up, so timed in ready_s
        first = resolve(Config.model_validate(configs[0][1]))
        build_optimizers(LM(first.model), first.optim)
    ready_s = time.time() - request["started"]
    if go is not None:
        go(ready_s)
    return {"ready_s": ready_s, "shapes": {k: _time_config(c, request["steps"]) for k, c in configs}}


def _main() -> None:
    """Child protocol: one request line in; a ready line out; wait for a go line; the
    result line out."""
    request = json.loads(sys.stdin.readline())

    def go(ready_s: float) -> None:
        print(json.dumps({"ready_s": ready_s}), flush=True)
        sys.stdin.readline()

    print(json.dumps(_child(request, go)), flush=True)


def _send(proc: subprocess.Popen, line: str) -> bool:
    """Write one line to a measuring process; False when it has already exited. Whether it
    is alive cannot be asked first: it may exit between the question and the write (a
    failed one does, at any instant), so the write itself is the test, and the failure is
    reported from its exit status and stderr like every other."""
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    except BrokenPipeError:
        return False
    return True


def measure(configs: Mapping[str, dict[str, Any]], threads: int | None, *, steps: int = 3,
            timeout: float = 600.0, side_by_side: int = 1) -> dict[str, Any]:
    """Time `configs` (shape key -> run config as JSON data) in child processes with
    `threads` torch threads each: `side_by_side` of them at once, as that many local
    workers share the machine (they compete for memory bandwidth and caches), each
    time averaged over them. Returns {"ready_s": …, "shapes": {key: {step_s, eval_s, …}}}."""
    env = {**os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    procs: list[subprocess.Popen] = []
    results = []
    try:
        # started one after another (each ready time is a worker's start-up, not a race
        # for the disk), then timed all at once
        for _ in range(max(1, side_by_side)):
            request = {"configs": dict(configs), "threads": threads, "steps": steps, "started": time.time()}
            proc = subprocess.Popen([sys.executable, "-m", "sanlab.study.speed"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
            if not _send(proc, json.dumps(request)) or not proc.stdout.readline():  # its ready line
                break  # it failed: said below, from its exit status
        for proc in procs:
            _send(proc, "go")
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                tail = (err.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"timing the arms failed: {tail}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return mean_result(results)


def mean_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The measuring processes' results averaged, figure by figure (`processes`: how many)."""
    def mean(values: Iterable[float]) -> float:
        values = list(values)
        return sum(values) / len(values)

    shapes = {key: {f: mean(r["shapes"][key][f] for r in results) for f in figures}
              for key, figures in results[0]["shapes"].items()}
    return {"ready_s": mean(r["ready_s"] for r in results), "shapes": shapes, "processes": len(results)}


def load_cache(study_dir: str | Path | None) -> dict[str, Any]:
    if study_dir is None:
        return {}
    return try_read_json_object(Path(study_dir) / SPEED_FILE) or {}  # a missing or torn cache: measure again


def save_cache(study_dir: str | Path, cache: Mapping[str, Any]) -> None:
    """Atomically (temp file + rename): a kill leaves the old cache or the new one."""
    path = Path(study_dir) / SPEED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SPEED_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def arm_speeds(runs: Iterable[Any], threads: int | None, study_dir: str | Path | None, *,
               steps: int = 3, side_by_side: int = 1) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Measured cost per run id: {run_id: {step_s, eval_s, setup_s, save_s, ready_s}},
    timing each distinct shape once (cached in the study dir; `side_by_side` processes
    at once, as many as run in parallel), and notes on what was not timed."""
    cache = load_cache(study_dir)
    shapes = cache.setdefault("shapes", {})
    by_run: dict[str, str] = {}
    todo: dict[str, dict[str, Any]] = {}
    skipped: set[str] = set()
    for r in runs:
        cfg = json.loads(r.config.model_dump_json())
        key = shape_key(cfg, threads or 0, side_by_side)
        if r.flops_per_token * cfg["train"]["batch_rows"] * cfg["data"]["seq_len"] > MAX_TIMED_STEP_FLOPS:
            skipped.add(r.arm)
            continue
        by_run[r.run_id] = key
        if key not in shapes:
            todo[key] = cfg
    notes = []
    if todo:
        got = measure(todo, threads, steps=steps, side_by_side=side_by_side)
        shapes.update(got["shapes"])
        cache["ready_s"] = got["ready_s"]
        if study_dir is not None:
            save_cache(study_dir, cache)
    if skipped:
        notes.append(f"not timed here (a step over {MAX_TIMED_STEP_FLOPS:.0e} FLOPs): "
                     f"{', '.join(sorted(skipped))}; their estimate scales runner.tokens_per_s by FLOPs")
    ready = float(cache.get("ready_s", 0.0))
    return {rid: {**shapes[k], "ready_s": ready} for rid, k in by_run.items()}, notes


if __name__ == "__main__":
    _main()
