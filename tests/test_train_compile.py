"""`train.compile`: auto resolves to on for CUDA and off on the CPU (recorded in config.json,
what ran in meta.json), and a compiler failure falls back to eager with one line of
warning instead of stopping the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sanlab.config import load_config
from sanlab.train.resolve import resolve_compile
from sanlab.train.trainer import resolve, train

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=320",
        "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=8", "train.log_every=1000", "train.steps=6",
        "train.eval_every=0"]


def test_auto_is_on_for_cuda_and_off_on_the_cpu():
    assert resolve_compile("auto", "cuda") is True
    assert resolve_compile("auto", "cpu") is False
    for device in ("cpu", "cuda"):
        assert resolve_compile(True, device) is True
        assert resolve_compile(False, device) is False
    assert load_config(None, []).train.compile == "auto"
    assert load_config(None, ["train.compile=true"]).train.compile is True
    assert resolve(load_config(None, ["train.device=cpu"])).train.compile is False
    assert resolve(load_config(None, ["train.device=cpu", "train.compile=true"])).train.compile is True


def test_a_cpu_run_by_default_is_not_compiled_and_says_so(train_data_dir: Path, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("auto compiled on the CPU"))
    meta = train(load_config(None, [f"data.dir={train_data_dir}", *TINY]), "run")
    assert meta["status"] == "completed" and meta["device"]["compile"] is False
    assert json.loads(Path("run/config.json").read_text())["train"]["compile"] is False


@pytest.mark.parametrize("when", ["at compile", "at the first call", "mid-run"])
def test_a_compiler_failure_trains_eagerly_with_one_line_of_warning(when, train_data_dir: Path, tmp_path: Path,
                                                                    monkeypatch, capsys):
    """train.compile=true whose compile fails (when torch.compile is called, when the
    compiled function first runs: where inductor fails, or at a later call: a recompile for
    a new shape) trains to the end eagerly, with
    one warning line, meta.json saying the model ran uncompiled; its losses are the eager
    run's."""
    monkeypatch.chdir(tmp_path)
    base = [f"data.dir={train_data_dir}", *TINY]
    eager = train(load_config(None, base + ["train.compile=false"]), "eager")

    def broken(fn, **kwargs):
        if when == "at compile":
            raise RuntimeError("backend failed\nlong compiler log")

        calls = []

        def run(*args, **kw):
            calls.append(1)
            if when == "mid-run" and len(calls) <= 3:  # the probe and two steps run "compiled"
                return fn(*args, **kw)
            raise RuntimeError("NoValidChoicesError: No choices to select\nlong compiler log")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    capsys.readouterr()
    meta = train(load_config(None, base + ["train.compile=true"]), "run")
    out = capsys.readouterr().out
    assert meta["status"] == "completed" and meta["final"]["steps"] == 6
    assert meta["device"]["compile"] is False
    assert json.loads(Path("run/config.json").read_text())["train"]["compile"] is True  # what was asked
    warnings = [line for line in out.splitlines() if "torch.compile failed" in line]
    assert len(warnings) == 1 and "RuntimeError" in warnings[0] and "long compiler log" not in out
    losses = [json.loads(line)["loss"] for line in Path("run/metrics.jsonl").read_text().splitlines()]
    assert losses == [json.loads(line)["loss"] for line in Path("eager/metrics.jsonl").read_text().splitlines()]
    assert eager["device"]["compile"] is False
