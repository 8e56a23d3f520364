"""A stand-in trainer for orchestration tests: same signature as `sanlab.train.trainer.train`.

Its validation loss is a known function of the arm and LR, so the tests can predict the
sweep, the locks and the gaps. Like the trainer it returns a finished run as it is
without training again, and it counts real trainings in `calls.txt` next to the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sanlab.config import Config

# Optimum as a multiple of SPEC §1.3's base LR: the SAN at 1×, the standard arms at 4×
# (so their sweeps need boundary extension).
BASE = {("san", "muon"): 0.02, ("ffn", "muon"): 0.04, ("san", "adamw"): 6e-4, ("ffn", "adamw"): 2.4e-3}


def expected_loss(cfg: Config) -> float | None:
    """3 + c·log2(multiplier / optimum)² + the arm's and the norm's shifts + 1e-4 per seed;
    c = 0.01, or SANLAB_FAKE_CURVATURE (a flat sweep: neighbours within the noise floor)."""
    import os

    c = float(os.environ.get("SANLAB_FAKE_CURVATURE", "0.01"))
    kind = "ffn" if cfg.model.ffn else "san"
    m = cfg.optim.lr / BASE[(kind, cfg.optim.name)]
    opt = 4.0 if kind == "ffn" else 1.0
    if m >= 32:
        return None  # diverges
    arm = -0.001 * cfg.model.n_layers * (cfg.model.ffn_dim if cfg.model.ffn else 0) / 256
    norm = 0.0015 if cfg.model.norm == "rms" else 0.0
    return 3.0 + c * math.log2(m / opt) ** 2 + arm + norm + 0.0001 * cfg.train.seed


def world_facts(cfg: Config) -> int | None:
    """The facts of the planted world the run trains on (its data dir's entropy_floor.json;
    the trainer runs in its run dir, where a relative data.dir points)."""
    floor = Path(str(cfg.data.dir)) / "entropy_floor.json"
    if not floor.is_file():
        return None
    return (json.loads(floor.read_text()).get("world") or {}).get("facts")


def axis_loss(cfg: Config, facts: int) -> float | None:
    """On a data axis: `expected_loss`, and the SAN pays 1e-4 nats per world fact (so its
    deficit grows with the world, by a known amount)."""
    base = expected_loss(cfg)
    return None if base is None else base + (0.0 if cfg.model.ffn else 1e-4 * facts)


def slow_train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """`train` that takes a while (SANLAB_FAKE_SECONDS, default 0.5 s) before it finishes:
    long enough to kill a study in the middle of a run."""
    import os
    import time

    if not (Path(out_dir) / "meta.json").is_file():
        time.sleep(float(os.environ.get("SANLAB_FAKE_SECONDS", "0.5")))
    return train(cfg, out_dir, resume=resume, force=force)


def train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    out = Path(out_dir)
    meta_path = out / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta["status"] in ("completed", "diverged"):
            return meta
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "calls.txt", "a") as f:
        f.write(out.name + "\n")
    if cfg.model.n_layers == 13:
        raise RuntimeError("boom")
    import os

    # the data-axis tests set SANLAB_FAKE_AXIS: then the loss depends on the world's size
    facts = world_facts(cfg) if os.environ.get("SANLAB_FAKE_AXIS") and cfg.data.dir else None
    loss = expected_loss(cfg) if facts is None else axis_loss(cfg, facts)
    status = "diverged" if loss is None else "completed"
    meta: dict[str, Any] = {"status": status, "final": {"val_loss": loss, "tokens": cfg.train.tokens}}
    # SANLAB_FAKE_TOKENS_PER_S="san=1000,ffn=100000": the training speed each kind reports
    speeds = os.environ.get("SANLAB_FAKE_TOKENS_PER_S")
    if speeds:
        meta["tokens_per_s"] = float(dict(kv.split("=") for kv in speeds.split(","))["ffn" if cfg.model.ffn else "san"])
    meta_path.write_text(json.dumps(meta))
    return meta


def process_train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """`train` that first records the process it runs in (process.json in its run dir): its
    pid, its parent's, whether torch's compiler stack was imported before the run began,
    its torch thread count and whether it ignores SIGINT; with SANLAB_FAKE_SECONDS it then waits that long."""
    import gc
    import os
    import signal
    import sys
    import time

    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "process.json").write_text(json.dumps({
        "gc_frozen": gc.get_freeze_count(), "gc_enabled": gc.isenabled(),
        "pid": os.getpid(), "ppid": os.getppid(), "preloaded": "torch._dynamo" in sys.modules,
        "threads": torch.get_num_threads(), "parent_env": os.environ.get("SANLAB_PARENT_PID"),
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}))
    time.sleep(float(os.environ.get("SANLAB_FAKE_SECONDS", "0")))
    return train(cfg, out_dir, resume=resume, force=force)


def timed_train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """`train` that takes SANLAB_FAKE_SECONDS_BY_KIND's seconds for its kind ("san=0.05,ffn=0.6")
    and appends its start and end times to times.jsonl next to the run."""
    import os
    import time

    out = Path(out_dir)
    if (out / "meta.json").is_file():
        return train(cfg, out_dir, resume=resume, force=force)
    seconds = dict(kv.split("=") for kv in os.environ.get("SANLAB_FAKE_SECONDS_BY_KIND", "san=0,ffn=0").split(","))
    start = time.time()
    time.sleep(float(seconds["ffn" if cfg.model.ffn else "san"]))
    meta = train(cfg, out_dir, resume=resume, force=force)
    with open(out.parent / "times.jsonl", "a") as f:
        f.write(json.dumps({"run": out.name, "start": start, "end": time.time()}) + "\n")
    return meta


def slow_deep_train(cfg: Config, out_dir: str | Path, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
    """`train` that first waits SANLAB_FAKE_DEEP_SECONDS when the model has an FFN and more
    than one layer (a study's iso-depth or iso-FLOP partner), so that it finishes last."""
    import os
    import time

    from sanlab.train.trainer import train as real

    if cfg.model.ffn and cfg.model.n_layers > 1 and not (Path(out_dir) / "meta.json").is_file():
        time.sleep(float(os.environ.get("SANLAB_FAKE_DEEP_SECONDS", "0")))
    return real(cfg, out_dir, resume=resume, force=force)
