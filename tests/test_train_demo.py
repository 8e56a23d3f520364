"""The default CPU config on the embedded corpus: a minute of training visibly learns, and
both arms learn with both optimizers at the paper's locked learning rates (SPEC §1.3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanlab.config import load_config
from sanlab.train.trainer import train

LOCKED_LR = {(False, "muon"): 0.02, (True, "muon"): 0.04, (False, "adamw"): 6e-4, (True, "adamw"): 2.4e-3}


@pytest.mark.slow
def test_default_config_trains_in_about_a_minute(default_data_dir: Path, tmp_path: Path) -> None:
    """Defaults throughout (4-layer d=128 SAN, Muon, WSD, bf16 where fast): 1M tokens, ~30–60 s."""
    meta = train(load_config(None, [f"data.dir={default_data_dir}", "train.tokens=1000000"]), tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 4.0  # 7.6 -> about 2.4 nats
    # Every region of the synth documents is learned, not just the markers.
    assert all(meta["final"][f"val_loss_{r}"] < 4.0 for r in ("query", "trace", "answer"))


@pytest.mark.slow
@pytest.mark.parametrize("ffn, optim", list(LOCKED_LR), ids=["san-muon", "std-muon", "san-adamw", "std-adamw"])
def test_both_arms_train_with_muon_and_adamw(default_data_dir: Path, tmp_path: Path, ffn: bool, optim: str) -> None:
    cfg = load_config(None, [f"data.dir={default_data_dir}", "train.tokens=250000", f"model.ffn={ffn}",
                             f"optim.name={optim}", f"optim.lr={LOCKED_LR[ffn, optim]}"])
    meta = train(cfg, tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 2.0
