"""Optional metric sinks: TensorBoard event files carry what metrics.jsonl records."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanlab.train.trainer import train
from test_train_loop import metrics, tiny_config


def test_tensorboard_gets_every_logged_scalar(train_data_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    meta = train(tiny_config(train_data_dir, "train.steps=4", "train.eval_every=2", "train.tensorboard=true"), run)
    assert meta["status"] == "completed"
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    rows = metrics(run)
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [r["step"] for r in rows]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    assert [e.step for e in events.Scalars("val_loss")] == [2, 4]


def test_wandb_offline_run_is_written(train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    meta = train(tiny_config(train_data_dir, "train.steps=2", "train.wandb=true"), run)
    assert meta["status"] == "completed"
    offline = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
