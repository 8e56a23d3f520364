"""The run directory: what it holds, how to read it back, and what to do with one that exists.

    RUN_DIR/config.json     the resolved Config (device and precision resolved)
    RUN_DIR/meta.json       versions, git commit, device, accounting, plan, status, metrics
    RUN_DIR/metrics.jsonl   one JSON object per optimizer step
    RUN_DIR/checkpoints/    latest/ and milestone-{pct:03d}/ (see checkpoint.py)

`decide` turns (what is on disk, the requested config, --resume, --force) into one of
three actions, so that a study can call `train` on every run of a grid again and again:
a finished run is returned as it is, an unfinished one resumes, a new one starts.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ValidationError

import sanlab
from sanlab.config import Config
from sanlab.errors import ConfigError
from sanlab.fileio import read_json_object, try_read_json_object
from sanlab.model.mixers import mixer_options

CONFIG_FILE, META_FILE, METRICS_FILE, CHECKPOINTS = "config.json", "meta.json", "metrics.jsonl", "checkpoints"
FINISHED = ("completed", "diverged")  # a recorded result: never retrained implicitly
_RUN_FILES = (CONFIG_FILE, META_FILE, METRICS_FILE, CHECKPOINTS, "tensorboard", "wandb")


def config_json(cfg: Config) -> dict[str, Any]:
    """The config as JSON data (tuples as lists), the form stored in config.json, with the
    mixer's options resolved (every option with its value, defaults included), so a run
    dir says what its variant ran even after a default changes."""
    data = json.loads(cfg.model_dump_json())
    try:
        data["model"]["mixer_options"] = mixer_options(cfg.model, cfg.model.mixer).model_dump(mode="json")
    except ConfigError:
        pass  # an unknown mixer or a bad option: stored as given (building the model refuses it)
    return data


# Mixer options whose default changed, with the value a run written before the option
# existed ran with (read from its stored model config).
_OPTIONS_BEFORE: dict[str, dict[str, Any]] = {
    "mixit": {"sigma_length": lambda model: "row"},  # σ_h built for mixer_options.seq_len
    "fixed_seq_qk": {"sequence": lambda model: "random"},  # random token ids
    "non_approximate": {"qk_norm": lambda model: model.get("qk_norm", True)},  # model.qk_norm decided
}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (temp file + rename): readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A run-dir JSON file's object, or None when it is missing or damaged (`sanlab.fileio`)."""
    return try_read_json_object(path)


def resumed_meta(path: Path) -> dict[str, Any]:
    """The meta.json a resume continues: what it adds to (resumes, started_at, wall time)
    kept where it has the right type, the rest as it is; a damaged or missing file is {}."""
    meta = read_json(path) or {}
    types = {"resumes": int, "started_at": str, "wall_time_s": (int, float)}
    return {k: v for k, v in meta.items()
            if k not in types or (isinstance(v, types[k]) and not isinstance(v, bool))}  # type: ignore[arg-type]


_HISTORY = {"resumes": int, "started_at": str, "wall_time_s": (int, float), "init": dict}


def check_history(path: Path) -> None:
    """A resume continues meta.json's history (how often the run resumed, when it started,
    its wall time, the evaluation at init), so a damaged meta.json is refused rather than
    rewritten without it: `ConfigError` naming the damage. A missing one holds no history
    to lose (a resume starts it again)."""
    if not path.exists():
        return
    why = ""
    try:
        meta = read_json_object(path, ConfigError)
    except ConfigError as e:
        why = str(e).removeprefix(f"{path}: ")
    else:
        bad = next((k for k, kind in _HISTORY.items() if k in meta
                    and (not isinstance(meta[k], kind) or isinstance(meta[k], bool))), None)  # type: ignore[arg-type]
        if bad is not None:
            why = f"{bad} is {json.dumps(meta[bad])[:40]}, not what the trainer writes"
    if why:
        raise ConfigError(f"--resume: {path} is damaged ({why}); it holds the run's history (resumes, start time, "
                          "wall time, the evaluation at init), which a resume would lose: restore it, or delete it "
                          "to resume without that history")


def first_difference(requested: Any, stored: Any) -> str | None:
    """The dotted key of the first difference between a requested config (as
    `config_json` gives it) and a stored one (normalised as this version writes it), or None."""
    return _first_difference(requested, _normalised(stored))


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The dotted key of the first difference between two JSON trees."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
            if d:
                return d
        return None
    return None if a == b else f"{prefix[:-1]} ({b!r} in the run dir, {a!r} requested)"


def _normalised(stored: Any) -> Any:
    """A stored config.json as this version writes it: keys added since (with their
    defaults) filled in, input spellings (`model.ffn`, `ffn_type`) resolved. A config that
    no longer validates is compared as it is."""
    if isinstance(stored, dict) and isinstance(stored.get("optim"), dict) and "ns_precision" not in stored["optim"]:
        stored = {**stored, "optim": {**stored["optim"], "ns_precision": "bf16"}}  # what such runs ran
    model = stored.get("model") if isinstance(stored, dict) else None
    if isinstance(model, dict) and isinstance(model.get("mixer_options", {}), dict):
        before = _OPTIONS_BEFORE.get(model.get("mixer", "softmax"), {})
        opts = dict(model.get("mixer_options", {}))
        missing = {k: value(model) for k, value in before.items() if k not in opts}
        if missing:
            stored = {**stored, "model": {**model, "mixer_options": {**opts, **missing}}}
    try:
        return config_json(Config.model_validate(stored))
    except ValidationError:
        return stored


@dataclass(frozen=True)
class Decision:
    action: Literal["fresh", "resume", "done"]
    meta: dict[str, Any] | None = None  # the existing meta for "done"
    force: bool = False  # a resume may continue under a config other than its checkpoint's


def decide(out: Path, cfg: Config, *, resume: bool, force: bool) -> Decision:
    """What to do with `out` for this request (read-only; `prepare` acts on it).

    - nothing there, or --resume with no checkpoint yet: start fresh;
    - a finished run (completed / diverged) with the same config: return it as it is;
    - an unfinished run with the same config: --resume continues it;
    - a different config, or an unfinished run without --resume: refuse, unless --force
      (with --resume: continue from the checkpoint under the new config, e.g. more steps;
      without: start over).
    """
    stored = read_json(out / CONFIG_FILE)
    if stored is None:
        if out.exists() and any(out.iterdir()) and not force:
            raise ConfigError(f"{out} exists and is not a sanlab run dir (use --force to write into it)")
        return Decision("fresh")
    meta = read_json(out / META_FILE) or {}
    has_ckpt = (out / CHECKPOINTS / "latest").exists() or (out / CHECKPOINTS / ".old-latest").exists()
    diff = _first_difference(config_json(cfg), _normalised(stored))
    if diff and not force:
        raise ConfigError(f"{out} holds a run with a different config: {diff}; use --force to override")
    if force and not resume:
        return Decision("fresh")
    if not diff and meta.get("status") in FINISHED:
        return Decision("done", meta)
    if resume:
        if has_ckpt:
            check_history(out / META_FILE)
        return Decision("resume", force=force) if has_ckpt else Decision("fresh")
    raise ConfigError(f"{out} holds an unfinished run (status {meta.get('status', 'unknown')}): "
                      "use --resume to continue or --force to start over")


def prepare(out: Path, decision: Decision) -> None:
    """Create the run dir, clearing an earlier run's files when starting fresh."""
    out.mkdir(parents=True, exist_ok=True)
    if decision.action == "fresh":
        for name in _RUN_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    (out / CHECKPOINTS).mkdir(exist_ok=True)
    for stale in (out / CHECKPOINTS).glob(".tmp-*"):  # a write cut short by a crash
        shutil.rmtree(stale)


def git_commit() -> dict[str, Any] | None:
    """The commit (and dirtiness) of the sanlab source tree, if it is a git checkout."""
    src = Path(sanlab.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=src,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def versions() -> dict[str, str]:
    import numpy

    return {"python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "sanlab": sanlab.__version__}


def device_info(device: torch.device, precision: str, world_size: int) -> dict[str, Any]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {"type": device.type, "name": name, "precision": precision, "world_size": world_size,
            "threads": torch.get_num_threads(), "hostname": platform.node()}
