"""Exact resume on CPU: a run stopped by SIGTERM or killed by SIGKILL, then resumed, logs
bit-identical losses to the uninterrupted run; and the refusals around resuming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sanlab.cli import main
from sanlab.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from sanlab.train.trainer import train
from test_train_loop import TINY, metrics, tiny_config

STEPS = 150
RUN = ["train.steps=150", "train.checkpoint_every=4", "train.eval_every=7", "train.threads=1"]


def exact(rows: list[dict]) -> list[tuple]:
    """What must match bit for bit (timings excluded)."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r.get("val_loss")) for r in rows]


@pytest.fixture(scope="module")
def reference(train_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    run = tmp_path_factory.mktemp("ref") / "run"
    assert train(tiny_config(train_data_dir, *RUN), run)["status"] == "completed"
    return exact(metrics(run))


def start(data_dir: Path, run: Path) -> subprocess.Popen:
    args = [f"data.dir={data_dir}", *TINY, *RUN]
    return subprocess.Popen([sys.executable, "-m", "sanlab", "train", *args, "--out", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen, run: Path, step: int) -> int:
    """Poll metrics.jsonl until it reaches `step`; return the last step seen."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            lines = (run / "metrics.jsonl").read_text().splitlines()
            last = json.loads(lines[-1])["step"] if lines else 0
        except (OSError, json.JSONDecodeError, IndexError):
            last = 0
        if last >= step:
            return last
        time.sleep(0.002)
    raise AssertionError("the run did not get going")


def resume(run: Path) -> None:
    assert main(["train", "--out", str(run), "--resume"]) == EXIT_OK  # config from the run dir
    assert json.loads((run / "meta.json").read_text())["status"] == "completed"


def test_sigterm_saves_and_resume_is_bit_identical(train_data_dir: Path, tmp_path: Path,
                                                   reference: list[tuple]) -> None:
    run = tmp_path / "run"
    proc = start(train_data_dir, run)
    wait_for_step(proc, run, 5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == EXIT_INTERRUPTED
    meta = json.loads((run / "meta.json").read_text())
    stopped = meta["final"]["steps"]
    assert meta["status"] == "interrupted" and 5 <= stopped < STEPS
    state = json.loads((run / "checkpoints" / "latest" / "state.json").read_text())
    assert state["step"] == stopped  # a checkpoint was written at the stop, between the regular ones
    resume(run)
    assert exact(metrics(run)) == reference


def test_sigkill_then_resume_is_bit_identical(train_data_dir: Path, tmp_path: Path,
                                              reference: list[tuple]) -> None:
    run = tmp_path / "run"
    proc = start(train_data_dir, run)
    wait_for_step(proc, run, 10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert json.loads((run / "meta.json").read_text())["status"] == "running"
    # What a kill mid-write leaves behind past the checkpoint: a whole line and half of one.
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 10_000, "loss": 0.0}) + '\n{"step": 10')
    resume(run)
    assert exact(metrics(run)) == reference


def test_resume_refuses_another_config_unless_forced(train_data_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    base = ["train", f"data.dir={train_data_dir}", *TINY, "train.eval_every=0"]
    assert main([*base, "train.steps=4", "--out", str(run)]) == EXIT_OK
    capsys.readouterr()
    assert main([*base, "train.steps=8", "--out", str(run), "--resume"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different config: train.steps" in err
    assert main([*base, "train.steps=4", "--out", str(run)]) == EXIT_OK  # same config: already complete
    # --force with --resume continues under the new config (here: a longer run).
    assert main(["train", "train.steps=8", "--out", str(run), "--resume", "--force"]) == EXIT_OK
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))


def test_corrupt_checkpoint_is_one_line(train_data_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    base = ["train", f"data.dir={train_data_dir}", *TINY, "train.eval_every=0"]
    assert main([*base, "train.steps=2", "--out", str(run)]) == EXIT_OK
    f = run / "checkpoints" / "latest" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*base, "train.steps=3", "--out", str(run), "--resume", "--force"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checksum mismatch" in err


def test_corrupt_data_shard_is_one_line(train_data_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A data file whose bytes changed (same size) is caught by its checksum before training,
    in either split (the run verifies the whole manifest once)."""
    import shutil

    for split in ("train", "val"):
        data = tmp_path / f"data-{split}"
        shutil.copytree(train_data_dir, data)
        f = data / f"{split}-00000.tokens.bin"
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        f.write_bytes(bytes(raw))
        capsys.readouterr()
        argv = ["train", f"data.dir={data}", *TINY, "train.steps=2", "--out", str(tmp_path / f"run-{split}")]
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "checksum mismatch" in err, err
        assert not (tmp_path / f"run-{split}" / "checkpoints").exists()


def test_fixed_seq_qk_sequence_survives_a_resume(train_data_dir: Path, tmp_path: Path) -> None:
    """FixedSeqQK's fixed sequence (the held-out split's first tokens) is in every
    checkpoint: a run resumed from its half-way checkpoint has the same sequence and logs
    bit-identical losses to the uninterrupted run."""
    import shutil

    from safetensors.torch import load_file

    from sanlab.data.shards import heldout_tokens

    args = ["model.mixer=fixed_seq_qk", "model.n_layers=2", "train.steps=8", "train.eval_every=4",
            "train.milestones=[0.5,1.0]", "train.threads=1"]
    whole = tmp_path / "whole"
    assert train(tiny_config(train_data_dir, *args), whole)["status"] == "completed"
    # the same run stopped at step 4: its half-way checkpoint as `latest`, the log up to there
    part = tmp_path / "part"
    shutil.copytree(whole, part)
    shutil.rmtree(part / "checkpoints" / "latest")
    shutil.copytree(part / "checkpoints" / "milestone-050", part / "checkpoints" / "latest")
    shutil.rmtree(part / "checkpoints" / "milestone-100")
    meta = json.loads((part / "meta.json").read_text())
    (part / "meta.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    resume(part)
    assert exact(metrics(part)) == exact(metrics(whole)) and len(metrics(whole)) == 8
    expected = torch.from_numpy(heldout_tokens(train_data_dir, 256))
    for run in (whole, part):
        saved = load_file(str(run / "checkpoints" / "latest" / "model.safetensors"))
        for i in range(2):
            assert torch.equal(saved[f"blocks.{i}.attn.tokens"], expected), (run, i)


def test_sigint_records_the_val_loss_of_the_step_it_stopped_at(train_data_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """With evaluation only at the end (eval_every=0), a run stopped by SIGINT is evaluated
    where it stopped: its record and its last line carry that step's validation loss (the
    value an uninterrupted run evaluating every step logs there), formatted; the resume
    ends with the final one."""
    every = tmp_path / "every"
    assert train(tiny_config(train_data_dir, *RUN[:3], "train.eval_every=1"), every)["status"] == "completed"
    val = {r["step"]: r["val_loss"] for r in metrics(every)}
    run = tmp_path / "run"
    args = [f"data.dir={train_data_dir}", *TINY, *RUN[:3], "train.eval_every=0"]
    proc = subprocess.Popen([sys.executable, "-m", "sanlab", "train", *args, "--out", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(proc, run, 5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    meta = json.loads((run / "meta.json").read_text())
    stopped = meta["final"]["steps"]
    assert meta["status"] == "interrupted" and 5 <= stopped < STEPS
    assert meta["final"]["val_loss"] == val[stopped]  # bit-identical: evaluation draws no random numbers
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"interrupted: {run}  steps {stopped}  train_loss ")
    assert f"  val_loss {val[stopped]:.4f}  (" in last and "None" not in last
    assert main(["train", "--out", str(run), "--resume"]) == EXIT_OK
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"completed: {run}  steps {STEPS}  train_loss ") and f"val_loss {val[STEPS]:.4f}" in last
    assert "val_loss" not in metrics(run)[stopped - 1]  # the log has the uninterrupted run's rows
