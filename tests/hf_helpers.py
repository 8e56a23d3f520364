"""Run dirs for the export tests: a sanlab model with every gain and gate moved off its
init (so each switch and each fold matters), saved through the trainer's own checkpoint
writer (safetensors + state.json with checksums), plus the helpers that load an export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sanlab.config import Config
from sanlab.model.lm import LM

TINY = dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=320)
SEQ_LEN = 32


def trained_looking(cfg: Config, seed: int = 0) -> LM:
    torch.manual_seed(seed)
    model = LM(cfg.model).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim < 2:  # norm gains and residual scalars
                p.add_(0.5 * torch.randn(p.shape, generator=g))
            else:  # matrices a little larger than init, so logits are not all near zero
                p.mul_(3.0)
    return model


def make_run(path: Path, data_dir: Path | None, seed: int = 0, step: int = 6, seq_len: int = SEQ_LEN,
             **model: Any) -> Path:
    """A completed run dir (config.json, meta.json, checkpoints/latest) of `TINY | model`,
    trained (as far as its config says) on rows of `seq_len`."""
    from sanlab.train.checkpoint import save
    from sanlab.train.optim import build_optimizers

    cfg = Config.model_validate({"model": {**TINY, **model}, "data": {"seq_len": seq_len,
                                 "dir": str(data_dir) if data_dir else None},
                                 "train": {"device": "cpu", "precision": "fp32"}})
    lm = trained_looking(cfg, seed)
    if hasattr(lm, "bind_data") and data_dir is not None:  # state a mixer takes from the data, as training does
        from sanlab.data.shards import heldout_tokens

        lm.bind_data(lambda n: torch.from_numpy(heldout_tokens(str(data_dir), n)), seq_len)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg.model_dump(), indent=1))
    meta = {"status": "completed", "final": {"val_loss": 4.321, "train_loss": 4.5, "tokens": 768, "steps": step},
            "git": {"commit": "0123abc", "dirty": False}, "versions": {"sanlab": "test", "torch": torch.__version__}}
    (path / "meta.json").write_text(json.dumps(meta))
    save(path / "checkpoints" / "latest", lm, build_optimizers(lm, cfg.optim), {"step": step})
    return path


def load_hf(folder: Path, **kw: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, use_safetensors=True,
                                                **kw).eval()


def load_sanlab(run: Path) -> LM:
    from sanlab.analysis.rundir import RunDir

    return RunDir.open(run).load_model()
