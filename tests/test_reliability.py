"""Crash and corruption behaviour: a full disk while checkpointing, a kill between `latest`
and its milestone copy, the resume messages, a manifest that lies about its shards, a
collapsed run, and a torn last line of a study's results store."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError

from sanlab.cli import main
from sanlab.data.loader import Loader
from sanlab.errors import EXIT_DIVERGED, EXIT_NO_SPACE, EXIT_OK, EXIT_USAGE, DataError
from sanlab.study.store import ResultStore
from sanlab.train import checkpoint
from sanlab.train.trainer import train
from test_train_loop import TINY, metrics, tiny_config

MILESTONES = "train.milestones=[0.0,0.25,0.5,0.75,1.0]"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sanlab: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def exact(rows: list[dict]) -> list[tuple]:
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"], r.get("val_loss")) for r in rows]


# --------------------------------------------------------------------------- disk full


_NO_SPACE = {
    "safetensors": SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                   'message: "No space left on device" })'),
    "oserror": OSError(errno.ENOSPC, "No space left on device"),
}


@pytest.mark.parametrize("kind", sorted(_NO_SPACE))
def test_disk_full_while_checkpointing_is_one_line_and_keeps_the_last_checkpoint(
        train_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    run = tmp_path / "run"
    real_save_file, real_fsync = checkpoint.save_file, checkpoint._fsync
    calls = {"n": 0}

    def failing_save_file(tensors: dict, path: str) -> None:
        calls["n"] += 1
        if calls["n"] >= 2:  # the checkpoint after step 0 finds the disk full
            raise _NO_SPACE["safetensors"]
        real_save_file(tensors, path)

    def failing_fsync(path: Path) -> None:
        if path.name == checkpoint.STATE_FILE and calls["n"] >= 1:
            raise _NO_SPACE["oserror"]
        if path.name == checkpoint.STATE_FILE:
            calls["n"] += 1
        real_fsync(path)

    if kind == "safetensors":
        monkeypatch.setattr(checkpoint, "save_file", failing_save_file)
    else:
        monkeypatch.setattr(checkpoint, "_fsync", failing_fsync)
    argv = ["train", f"data.dir={train_data_dir}", *TINY, "train.steps=4", "train.checkpoint_every=2",
            "train.eval_every=0", "train.milestones=[0.0]", "--out", str(run)]
    assert main(argv) == EXIT_NO_SPACE
    assert "no space left on the device" in one_error_line(capsys)
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "milestone-000"]  # no temp dir left
    assert checkpoint.read_state(ckpts / "latest")["step"] == 0  # the previous checkpoint, intact
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"


def test_disk_full_while_preparing_is_one_line_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from sanlab.data import shards

    def full(self: object, arr: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards._HashedFile, "write", full)
    assert main(["prepare", "--tokens", "2000", "seq_len=32", "vocab_size=320", "--out", str(tmp_path / "d")]) \
        == EXIT_NO_SPACE
    assert "no space left on the device while writing the prepared data for" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no temp dir, no half-prepared dir


def test_disk_full_in_any_command_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "out.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "out.json"
    assert main(["signal", "--depths", "2", "--rows", "1", "--seq-len", "8", "--json", str(out)]) == EXIT_NO_SPACE
    assert f"no space left on the device writing {out}" in one_error_line(capsys)


# --------------------------------------------------------------------------- milestones


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after the raise runs."""


def _milestone_files(run: Path) -> dict[str, bytes]:
    return {p.name: (p / checkpoint.MODEL_FILE).read_bytes()
            for p in sorted((run / "checkpoints").glob("milestone-*"))}


@pytest.fixture(scope="module")
def milestone_reference(train_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("milestone-ref") / "run"
    cfg = tiny_config(train_data_dir, "train.steps=8", "train.eval_every=3", MILESTONES, "train.threads=1")
    assert train(cfg, run)["status"] == "completed"
    return run


@pytest.mark.parametrize("pct", [25, 50, 100])
def test_kill_between_latest_and_the_milestone_copy_loses_no_milestone(
        train_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        milestone_reference: Path, pct: int) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(train_data_dir, "train.steps=8", "train.eval_every=3", MILESTONES, "train.threads=1")
    real_copy = checkpoint.copy

    def copy_then_die(src: Path, dest: Path) -> None:
        if dest.name == f"milestone-{pct:03d}":
            raise _Killed  # `latest` is at the milestone step; its copy never happens
        real_copy(src, dest)

    monkeypatch.setattr(checkpoint, "copy", copy_then_die)
    with pytest.raises(_Killed):
        train(cfg, run)
    assert not (run / "checkpoints" / f"milestone-{pct:03d}").exists()
    monkeypatch.setattr(checkpoint, "copy", real_copy)
    assert train(cfg, run, resume=True)["status"] == "completed"
    assert _milestone_files(run) == _milestone_files(milestone_reference)  # every one, bit for bit
    assert exact(metrics(run)) == exact(metrics(milestone_reference))


@pytest.mark.slow
def test_kills_at_random_points_keep_every_milestone_and_exact_losses(
        train_data_dir: Path, tmp_path: Path) -> None:
    """SIGKILL a real training process at random instants, resume until it completes."""
    steps = 40
    run_args = [f"data.dir={train_data_dir}", *TINY, f"train.steps={steps}", "train.eval_every=5",
                "train.checkpoint_every=3", MILESTONES, "train.threads=1"]
    reference = tmp_path / "reference"
    assert main(["train", *run_args, "--out", str(reference)]) == EXIT_OK
    rng = random.Random(12)
    for trial in range(3):
        run = tmp_path / f"run{trial}"
        kills = 0
        while True:
            cmd = [sys.executable, "-m", "sanlab", "train", *run_args, "--out", str(run)]
            if run.exists():
                cmd.append("--resume")
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                proc.wait(timeout=rng.uniform(1.5, 4.0) if kills < 6 else 300)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
            assert proc.returncode == EXIT_OK, proc.stderr.read().decode() if proc.stderr else ""
            break
        assert json.loads((run / "meta.json").read_text())["status"] == "completed"
        assert _milestone_files(run) == _milestone_files(reference), f"trial {trial} after {kills} kills"
        assert exact(metrics(run)) == exact(metrics(reference))


# --------------------------------------------------------------------------- resume messages


def test_resume_says_what_is_wrong(train_data_dir: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--out", str(tmp_path / "nowhere"), "--resume"]) == EXIT_USAGE
    assert "does not exist, so there is no run to resume" in one_error_line(capsys)
    started = tmp_path / "started"
    (started / "checkpoints").mkdir(parents=True)  # killed before config.json was written
    assert main(["train", "--out", str(started), "--resume"]) == EXIT_USAGE
    assert "has no config.json" in one_error_line(capsys)

    run = tmp_path / "run"
    base = ["train", f"data.dir={train_data_dir}", *TINY, "train.eval_every=0", "train.steps=2"]
    assert main([*base, "--out", str(run)]) == EXIT_OK
    capsys.readouterr()
    assert main(["train", "model.d_model=64", "model.n_heads=4", "--out", str(run), "--resume", "--force"]) \
        == EXIT_USAGE
    line = one_error_line(capsys)
    assert "embed.weight has shape [320, 32] in the checkpoint, [320, 64] in the model" in line

    f = run / "checkpoints" / "latest" / "optim.safetensors"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    assert main(["train", "--out", str(run), "--resume"]) == EXIT_USAGE  # a completed run
    assert "is a finished run, but" in (line := one_error_line(capsys)) and "checksum mismatch" in line


# --------------------------------------------------------------------------- prepared data


def _lying_copy(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


LIES = {
    "more rows": (lambda m: m["splits"]["train"].update(rows=m["splits"]["train"]["rows"] + 7),
                  "splits.train.rows is"),
    "fewer shard rows": (lambda m: m["splits"]["val"]["shards"][0].update(rows=m["splits"]["val"]["shards"][0]["rows"] - 1),
                         "splits.val.shards[0].files.tokens says"),
    "documents": (lambda m: m["splits"]["train"].update(documents=m["splits"]["train"]["documents"] + 1),
                  "splits.train.doc_files."),
    "tokens": (lambda m: m["splits"]["train"].update(tokens=m["splits"]["train"]["tokens"] - 3),
               "splits.train: tokens"),
    "seq_len": (lambda m: m.update(seq_len=m["seq_len"] * 2), "says"),
    "no shards": (lambda m: m["splits"]["train"].pop("shards"), "has no list of shards"),
    "bad dtype": (lambda m: m["splits"]["train"]["shards"][0]["files"]["tokens"].update(dtype="float128x"),
                  "is not a numpy dtype"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_manifest_that_lies_about_its_shards_is_refused(train_data_dir: Path, tmp_path: Path, lie: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    edit, needle = LIES[lie]
    data = _lying_copy(train_data_dir, tmp_path / "data", edit)
    with pytest.raises(DataError, match="manifest.json"):
        Loader(data, "train", batch_rows=8, verify=False)
    argv = ["train", f"data.dir={data}", *TINY, "train.steps=2", "--out", str(tmp_path / "run")]
    assert main(argv) == EXIT_USAGE
    assert needle in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_document_files_that_disagree_with_the_manifest_are_refused(train_data_dir: Path, tmp_path: Path) -> None:
    import numpy as np

    data = tmp_path / "data"
    shutil.copytree(train_data_dir, data)
    f = data / "train.doc_length.bin"
    lengths = np.fromfile(f, dtype="int32")
    lengths[0] += 1  # same size, different content: only the sha256 or the counts can tell
    lengths.tofile(f)
    with pytest.raises(DataError, match="documents hold"):
        Loader(data, "train", batch_rows=8, verify=False)


# --------------------------------------------------------------------------- collapse


def test_a_collapsed_run_is_diverged_not_completed(train_data_dir: Path, tmp_path: Path) -> None:
    """A huge AdamW LR kills this model within a few steps: loss ln(320), gradient 0."""
    run = tmp_path / "run"
    cfg = tiny_config(train_data_dir, "train.steps=40", "train.eval_every=0", "optim.name=adamw",
                      "optim.lr=1000", "optim.adam_lr=1000", "model.n_layers=2", "train.threads=1")
    meta = train(cfg, run)
    assert meta["status"] == "diverged" and meta["diverged_reason"] == "collapse"
    assert meta["final"]["steps"] < 40
    assert main(["train", "--out", str(run), "--resume"]) == EXIT_DIVERGED  # a recorded result


# --------------------------------------------------------------------------- results store


def test_a_torn_last_line_is_repaired_and_the_next_record_kept(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.append({"type": "run", "run_id": "a", "status": "completed"})
    torn = '{"type": "run", "run_id": "b", "sta'
    with open(store.path, "a") as f:
        f.write(torn)  # the study was killed mid-append
    store.append({"type": "run", "run_id": "c", "status": "failed"})
    assert set(store.runs()) == {"a", "c"}
    assert (tmp_path / "results.jsonl.torn").read_text() == torn + "\n"
    # A complete last record that merely lacks its newline is kept, not moved aside.
    with open(store.path, "a") as f:
        f.write('{"type": "run", "run_id": "d", "status": "completed"}')
    store.append({"type": "lock", "arm": "san", "optimizer": "muon", "lr": 0.02})
    assert set(store.runs()) == {"a", "c", "d"} and set(store.locks()) == {("san", "muon")}


def test_records_missing_their_keys_are_skipped(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.append({"type": "run", "status": "completed"})  # no run_id
    store.append({"type": "lock", "arm": "san"})  # no optimizer
    store.append({"type": "run", "run_id": "a", "status": "completed"})
    assert set(store.runs()) == {"a"} and store.locks() == {}


def test_records_of_the_wrong_types_are_damaged_lines(tmp_path: Path) -> None:
    """A run / lock record whose fields lack the types the study writes them with is a
    damaged line: skipped by every reader and named, like a line that is not JSON."""
    store = ResultStore(tmp_path)
    good = {"type": "run", "run_id": "a", "status": "completed", "final": {"val_loss": 5.0}}
    store.append(good)
    with open(store.path, "a") as f:
        for rec in ({"type": "run", "run_id": "b"},  # no status
                    {"type": "run", "run_id": "c", "status": "completed", "final": [5.0]},
                    {"type": "run", "run_id": "d", "status": "completed", "multiplier": "2"},
                    {"type": "lock", "arm": "san", "optimizer": "muon", "lr": "0.02"}):
            f.write(json.dumps(rec) + "\n")
    assert set(store.runs()) == {"a"} and store.locks() == {}
    assert store.damaged() == [2, 3, 4, 5]
