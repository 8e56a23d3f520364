"""The default CPU config on the embedded corpus: a minute of training visibly learns, and
both arms learn with both optimizers at the paper's locked learning rates (SPEC §1.3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sanlab.config import load_config
from sanlab.train.trainer import train

LOCKED_LR = {(False, "muon"): 0.02, (True, "muon"): 0.04, (False, "adamw"): 6e-4, (True, "adamw"): 2.4e-3}


def _unigram_val_loss(data_dir: Path) -> float:
    """Cross-entropy of the val tokens under the train split's token frequencies (add-½):
    what a model that learned nothing but how often each token occurs would score."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    dtype = np.dtype(manifest["token_dtype"])
    train_ids = np.concatenate([np.fromfile(f, dtype=dtype) for f in sorted(data_dir.glob("train-*.tokens.bin"))])
    val_ids = np.concatenate([np.fromfile(f, dtype=dtype) for f in sorted(data_dir.glob("val-*.tokens.bin"))])
    counts = np.bincount(train_ids, minlength=manifest["vocab_size"]) + 0.5
    return float(-np.log(counts[val_ids] / counts.sum()).mean())


@pytest.mark.slow
def test_default_config_trains_in_about_a_minute(default_data_dir: Path, tmp_path: Path) -> None:
    """Defaults throughout (4-layer d=128 SAN, Muon, WSD, bf16 where fast): 1M tokens, ~30–60 s.

    Measured on the synth corpus (entropy floor 0.12 nats/token on val): 7.64 -> 3.70 nats;
    by region query 4.29, trace 3.60, answer 3.97 from ~7.6 each."""
    meta = train(load_config(None, [f"data.dir={default_data_dir}", "train.tokens=1000000"]), tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 3.5
    unigram = _unigram_val_loss(default_data_dir)
    assert unigram < meta["init"]["val_loss"] - 1.0  # the bar itself is a learned level, not the init
    assert meta["final"]["val_loss"] < unigram - 2.0  # far past token frequencies (measured 3.70 against 6.03)
    # Every region of the synth documents is learned, not just the markers.
    for r in ("query", "trace", "answer"):
        assert meta["final"][f"val_loss_{r}"] < meta["init"][f"val_loss_{r}"] - 3.0, r


@pytest.mark.slow
@pytest.mark.parametrize("ffn, optim", list(LOCKED_LR), ids=["san-muon", "std-muon", "san-adamw", "std-adamw"])
def test_both_arms_train_with_muon_and_adamw(default_data_dir: Path, tmp_path: Path, ffn: bool, optim: str) -> None:
    cfg = load_config(None, [f"data.dir={default_data_dir}", "train.tokens=250000", f"model.ffn={ffn}",
                             f"optim.name={optim}", f"optim.lr={LOCKED_LR[ffn, optim]}"])
    meta = train(cfg, tmp_path / "run")
    assert meta["status"] == "completed"
    # Below what token frequencies alone give (6.03 nats here): the arm uses context.
    # Measured at 250k tokens from 7.63: SAN 5.92 (Muon) and 5.73 (AdamW), standard 5.49
    # (Muon) and 3.70 (AdamW); the SAN arms have only just passed the unigram level.
    unigram = _unigram_val_loss(default_data_dir)
    assert unigram < meta["init"]["val_loss"] - 1.0  # the bar itself is a learned level, not the init
    assert meta["final"]["val_loss"] < unigram
