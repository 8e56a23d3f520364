"""The training loop on a tiny prepared synth dir: run dir contract, both arms × both
optimizers, gradient accumulation, divergence, completed-run detection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.config import Config, load_config
from sanlab.errors import EXIT_DIVERGED
from sanlab.train.trainer import train

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
        "model.vocab_size=320", "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=16",
        "train.log_every=1000"]


def tiny_config(data_dir: Path, *extra: str) -> Config:
    return load_config(None, [f"data.dir={data_dir}", *TINY, *extra])


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_dir_describes_itself(train_data_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    meta = train(tiny_config(train_data_dir, "train.steps=24", "train.eval_every=8"), run)
    assert meta["status"] == "completed"
    assert json.loads((run / "meta.json").read_text()) == meta

    cfg = json.loads((run / "config.json").read_text())
    assert cfg["train"]["device"] == "cpu" and cfg["train"]["precision"] in ("bf16", "fp32")
    assert cfg["model"]["d_model"] == 32

    assert {"python", "torch", "sanlab"} <= set(meta["versions"])
    assert meta["device"]["type"] == "cpu"
    assert meta["accounting"]["params_total"] == meta["accounting"]["params_module"]
    assert meta["accounting"]["train_flops_per_token"] > 0
    assert meta["final"]["steps"] == 24 and meta["final"]["tokens"] == 24 * 8 * 32
    assert meta["tokens_per_s"] > 0 and meta["wall_time_s"] > 0

    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 25))
    assert {"step", "tokens", "loss", "lr", "tokens_per_s", "grad_norm"} <= set(rows[0])
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [8, 16, 24]
    # The synth corpus has regions, so the held-out loss is split by them too.
    assert {"val_loss_query", "val_loss_trace", "val_loss_answer"} <= set(evals[-1])
    assert meta["final"]["val_loss"] == evals[-1]["val_loss"] < meta["init"]["val_loss"]

    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "milestone-000", "milestone-025", "milestone-050", "milestone-075",
                     "milestone-100"]
    state = json.loads((run / "checkpoints" / "milestone-050" / "state.json").read_text())
    assert state["step"] == 12 and state["loader"]["step"] == 12


@pytest.mark.parametrize("ffn", [False, True], ids=["san", "standard"])
@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_both_arms_train_with_both_optimizers(train_data_dir: Path, tmp_path: Path, ffn: bool,
                                              optim: str) -> None:
    lr = {"muon": "0.05", "adamw": "3e-3"}[optim]
    cfg = tiny_config(train_data_dir, "train.steps=20", "train.eval_every=0", f"model.ffn={ffn}",
                      f"optim.name={optim}", f"optim.lr={lr}", "optim.adam_lr=3e-3")
    meta = train(cfg, tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 0.3


def test_gradient_accumulation_matches_the_full_batch(train_data_dir: Path, tmp_path: Path) -> None:
    base = ["train.steps=6", "train.eval_every=0", "train.precision=fp32"]
    full = train(tiny_config(train_data_dir, *base), tmp_path / "full")
    accum = train(tiny_config(train_data_dir, *base, "train.micro_batch_rows=2"), tmp_path / "accum")
    assert accum["plan"]["accum"] == 4 and full["plan"]["accum"] == 1
    for a, b in zip(metrics(tmp_path / "full"), metrics(tmp_path / "accum")):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-5)
    assert full["final"]["val_loss"] == pytest.approx(accum["final"]["val_loss"], rel=1e-4)


def test_a_finished_run_is_not_retrained(train_data_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(train_data_dir, "train.steps=3", "train.eval_every=0")
    first = train(cfg, tmp_path / "run")
    lines = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = train(cfg, tmp_path / "run", resume=True)
    assert again == first and (tmp_path / "run" / "metrics.jsonl").read_text() == lines
    redo = train(cfg, tmp_path / "run", force=True)  # --force starts over
    assert redo["finished_at"] != first["finished_at"]


def test_divergence_is_a_recorded_result(train_data_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    args = [f"data.dir={train_data_dir}", *TINY, "train.steps=40", "optim.name=adamw", "optim.lr=1e4"]
    assert main(["train", *args, "--out", str(run)]) == EXIT_DIVERGED
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "diverged"
    rows = metrics(run)
    assert rows[-1]["diverged"] is True and rows[-1]["step"] == meta["final"]["steps"] < 40
    assert all(math.isfinite(r["loss"]) for r in rows[:-1])  # the record up to it is kept
    assert "diverged" in capsys.readouterr().out


def test_loss_spike_counts_as_divergence(train_data_dir: Path, tmp_path: Path) -> None:
    # A factor below 1 flags the first step whose loss is not below the running mean.
    cfg = tiny_config(train_data_dir, "train.steps=40", "train.eval_every=0", "train.spike_factor=0.5")
    meta = train(cfg, tmp_path / "run")
    assert meta["status"] == "diverged" and meta["final"]["steps"] == 11  # after 10 warmup steps


def test_explicit_bf16_on_a_cpu_that_emulates_it_is_noted(train_data_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """train.precision=bf16 on a CPU without bf16 instructions trains as asked, with one
    line saying it is emulated; `auto` there records fp32 for both precisions."""
    from sanlab.train import host

    monkeypatch.setattr(host, "cpu_has_native_bf16", lambda: False)
    meta = train(tiny_config(train_data_dir, "train.steps=2", "train.eval_every=0", "train.precision=bf16"),
                 tmp_path / "bf16")
    assert meta["status"] == "completed"
    out = capsys.readouterr().out
    assert sum("emulated" in line for line in out.splitlines()) == 1 and "train.precision=bf16" in out
    train(tiny_config(train_data_dir, "train.steps=2", "train.eval_every=0"), tmp_path / "auto")
    assert "emulated" not in capsys.readouterr().out
    stored = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert (stored["train"]["precision"], stored["optim"]["ns_precision"]) == ("fp32", "fp32")
