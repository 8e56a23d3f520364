"""Data parallelism: two CPU processes (gloo) follow the single-process loss trajectory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sanlab.train import dist
from sanlab.train.trainer import train
from test_train_loop import TINY, metrics, tiny_config

RUN = ["train.steps=6", "train.eval_every=3", "train.precision=fp32", "train.threads=1"]


def test_single_process_dist_is_a_no_op() -> None:
    d = dist.setup("cpu")
    assert not d.enabled and d.is_main and d.sum([1.5, 2.0]) == [1.5, 2.0] and d.any(True)
    d.barrier()
    d.close()


def test_two_processes_match_one(train_data_dir: Path, tmp_path: Path) -> None:
    single = train(tiny_config(train_data_dir, *RUN), tmp_path / "single")
    args = [f"data.dir={train_data_dir}", *TINY, *RUN]
    proc = subprocess.run([sys.executable, "-m", "sanlab", "train", *args, "--out", str(tmp_path / "ddp"),
                           "--nproc", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "ddp" / "meta.json").read_text())
    assert meta["status"] == "completed" and meta["device"]["world_size"] == 2
    one, two = metrics(tmp_path / "single"), metrics(tmp_path / "ddp")
    assert [r["step"] for r in two] == [r["step"] for r in one]  # rank 0 alone wrote the log
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    assert meta["final"]["val_loss"] == pytest.approx(single["final"]["val_loss"], rel=1e-5)


def test_exit_worker_skips_finalisation_only_under_torchrun(tmp_path: Path) -> None:
    """A torchrun worker exits with its code before interpreter finalisation (no atexit
    handler runs); a plain process just gets the code back."""
    assert dist.exit_worker(3) == 3  # not under torchrun here
    marker = tmp_path / "atexit-ran"
    code = (f"import atexit, pathlib; atexit.register(lambda: pathlib.Path({str(marker)!r}).touch()); "
            "from sanlab.train.dist import exit_worker; exit_worker(3)")
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == 3 and not marker.exists()
