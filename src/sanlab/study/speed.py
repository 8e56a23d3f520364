"""Measured speed of a study's arms, for the time estimate of `study plan`.

Scaling one throughput by FLOPs per token is wrong for exactly the arms a study is
about: a deep attention-only stack spends time in softmax, masking, norms and small
products that carry few counted FLOPs (measured: the SAN runs ~1.7x slower than
its FLOP ratio on a CPU). So the estimate times the real training step of every
distinct arm shape on this machine instead:

- one child process (`python -m sanlab.study.speed`) with the thread count a run of
  the study gets, started the way a worker starts: its time to be ready to train is
  the per-run start-up cost;
- per distinct (model, batch, precision) shape: a warm-up step and `steps` timed
  training steps (forward with the fused loss, backward, clip, optimizer step:
  the trainer's step on synthetic tokens) and one timed evaluation pass.

Results are cached in the study dir (`speed.json`) under a key of everything that
changes the step's cost (model, batch split, seq_len, precision, device, threads,
versions), so a second `study plan` or `study run` does not time them again. Arms
whose step would be too large to time here (a GPU-scale spec planned on a laptop) are
left to the FLOP-scaled estimate, and the plan says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

SPEED_FILE = "speed.json"
# Steps above this many training FLOPs are not timed by `study plan` (about a minute
# on a laptop CPU); their estimate scales `runner.tokens_per_s` by FLOPs instead.
MAX_TIMED_STEP_FLOPS = 5e12


def local_threads(runner: Any) -> int:
    """Torch threads a local worker's run gets (as `sanlab.study.runner.LocalRunner`)."""
    return runner.threads or max(1, (os.cpu_count() or 1) // runner.workers)


def shape_key(cfg: Mapping[str, Any], threads: int) -> str:
    """What decides a step's cost: model, rows and their split, seq_len, precision,
    device, threads and the software versions (not LR, seed or length)."""
    import torch

    from sanlab import __version__

    t = cfg["train"]
    parts = {"model": cfg["model"], "seq_len": cfg["data"]["seq_len"], "batch_rows": t["batch_rows"],
             "micro_batch_rows": t.get("micro_batch_rows"), "precision": t.get("precision"),
             "device": t.get("device"), "compile": t.get("compile"), "eval_rows": t.get("eval_rows"),
             "freeze": t.get("freeze"), "optimizer": cfg["optim"]["name"], "threads": threads,
             "versions": [__version__, torch.__version__]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _time_config(cfg_data: dict[str, Any], steps: int) -> dict[str, float]:
    """Seconds per training step and per evaluation pass of one config, in this process."""
    import torch

    from sanlab.config import Config
    from sanlab.model.lm import LM
    from sanlab.train.optim import build_optimizers, clip_grad_norm
    from sanlab.train.trainer import make_plan, resolve

    cfg = resolve(Config.model_validate(cfg_data))
    t, T = cfg.train, cfg.data.seq_len
    plan = make_plan(cfg.model_copy(update={"train": t.model_copy(update={"tokens": None, "steps": 1})}), 1)
    device = torch.device(t.device)
    torch.manual_seed(0)
    model = LM(cfg.model).to(device)
    optims = build_optimizers(model, cfg.optim)
    step_model = torch.compile(model) if t.compile else model
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
                loss, _ = step_model(inputs, seg, targets, mask, t.z_loss)
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
    return {"step_s": step_s, "eval_s": time.perf_counter() - t0,
            "tokens_per_s": plan.tokens_per_step / step_s}


def _child(request: dict[str, Any]) -> dict[str, Any]:
    """The measuring process: ready time, then each config in turn."""
    import torch

    import sanlab.train.trainer  # noqa: F401  (a worker imports the trainer before it trains)
    from sanlab.train.host import tune_cpu_allocator

    threads = request["threads"]
    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()  # as `sanlab train` does on the CPU
    ready_s = time.time() - request["started"]
    return {"ready_s": ready_s,
            "shapes": {k: _time_config(c, request["steps"]) for k, c in request["configs"].items()}}


def measure(configs: Mapping[str, dict[str, Any]], threads: int | None, *, steps: int = 3,
            timeout: float = 600.0) -> dict[str, Any]:
    """Time `configs` (shape key -> run config as JSON data) in one child process with
    `threads` torch threads. Returns {"ready_s": …, "shapes": {key: {step_s, eval_s, tokens_per_s}}}."""
    request = {"configs": dict(configs), "threads": threads, "steps": steps, "started": time.time()}
    env = {**os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, "-m", "sanlab.study.speed"], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"timing the arms failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_cache(study_dir: str | Path | None) -> dict[str, Any]:
    if study_dir is None:
        return {}
    try:
        data = json.loads((Path(study_dir) / SPEED_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # a missing or torn cache is only a cache: measure again
    return data if isinstance(data, dict) else {}


def save_cache(study_dir: str | Path, cache: Mapping[str, Any]) -> None:
    """Atomically (temp file + rename): a kill leaves the old cache or the new one."""
    path = Path(study_dir) / SPEED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SPEED_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def arm_speeds(runs: Iterable[Any], threads: int | None, study_dir: str | Path | None, *,
               steps: int = 3) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Measured cost per run id: {run_id: {step_s, eval_s, ready_s}}, timing each distinct
    shape once (cached in the study dir), and notes on what was not timed."""
    cache = load_cache(study_dir)
    shapes = cache.setdefault("shapes", {})
    by_run: dict[str, str] = {}
    todo: dict[str, dict[str, Any]] = {}
    skipped: set[str] = set()
    for r in runs:
        cfg = json.loads(r.config.model_dump_json())
        key = shape_key(cfg, threads or 0)
        if r.flops_per_token * cfg["train"]["batch_rows"] * cfg["data"]["seq_len"] > MAX_TIMED_STEP_FLOPS:
            skipped.add(r.arm)
            continue
        by_run[r.run_id] = key
        if key not in shapes:
            todo[key] = cfg
    notes = []
    if todo:
        got = measure(todo, threads, steps=steps)
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
    print(json.dumps(_child(json.loads(sys.stdin.read()))))
