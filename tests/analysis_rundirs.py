"""Hand-written run dirs for the analysis tests: config.json plus safetensors checkpoints.

They follow the run-dir contract in docs/architecture.md without running the trainer,
so the readers are tested on exactly what the contract promises.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from sanlab.config import Config, ModelConfig
from sanlab.model.lm import LM


def write_run(
    path: Path,
    model: ModelConfig,
    checkpoints: dict[str, Callable[[LM], None]] | None = None,
    data_dir: Path | None = None,
    seed: int = 0,
) -> Path:
    """A run dir whose checkpoint `name` holds a seeded LM after `edit(model)` (no training)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = Config(model=model)
    cfg.data.dir = str(data_dir) if data_dir is not None else None
    (path / "config.json").write_text(json.dumps(cfg.model_dump(), indent=1))
    (path / "meta.json").write_text(json.dumps({"status": "completed"}))
    for name, edit in (checkpoints or {"latest": lambda m: None}).items():
        torch.manual_seed(seed)
        lm = LM(model)
        with torch.no_grad():
            edit(lm)
        d = path / "checkpoints" / name
        d.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, str(d / "model.safetensors"))
        seal(d)
    return path


def seal(checkpoint_dir: Path) -> None:
    """The checkpoint's state.json with the sha256 of its weights, as the trainer writes it
    (every reader verifies the weights against it)."""
    from sanlab.train.checkpoint import FORMAT, MODEL_FILE, STATE_FILE, _sha256

    state = {"format": FORMAT, "step": 0, "checksums": {MODEL_FILE: _sha256(checkpoint_dir / MODEL_FILE)}}
    (checkpoint_dir / STATE_FILE).write_text(json.dumps(state))
