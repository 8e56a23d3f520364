"""What the run dir, the metrics log and the stop signals give, value by value (bugs an
audit planted in `sanlab.train.rundir`, `sanlab.train.logs` and `sanlab.train.signals`
that the rest of the suite let through).
"""

from __future__ import annotations

import copy
import errno
import json
import types
from pathlib import Path

import pytest

from sanlab.config import Config
from sanlab.train import logs, rundir

# --------------------------------------------------------------------------- rundir


def test_a_run_dir_json_write_cut_short_leaves_the_old_file_whole(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """write_json is a temporary file and a rename: a full disk mid-write never tears meta.json."""
    meta = tmp_path / rundir.META_FILE
    rundir.write_json(meta, {"status": "running", "resumes": 1})
    before = meta.read_text()
    real = Path.write_text

    def half_then_full(self: Path, data: str, *a, **k) -> int:  # noqa: ANN002, ANN003
        real(self, data[: len(data) // 2], *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(OSError):
        rundir.write_json(meta, {"status": "completed", "resumes": 1, "final": {"val_loss": 2.5}})
    monkeypatch.undo()
    assert meta.read_text() == before and json.loads(before)["status"] == "running"


def test_a_resume_keeps_only_history_of_the_right_type(tmp_path: Path) -> None:
    meta = tmp_path / rundir.META_FILE
    meta.write_text(json.dumps({"resumes": True, "started_at": 5, "wall_time_s": False, "status": "interrupted",
                                "init": {"val_loss": 6.0}}))
    assert rundir.resumed_meta(meta) == {"status": "interrupted", "init": {"val_loss": 6.0}}  # a bool is no count
    meta.write_text(json.dumps({"resumes": 2, "started_at": "2024-01-01T00:00:00", "wall_time_s": 12}))
    assert rundir.resumed_meta(meta) == {"resumes": 2, "started_at": "2024-01-01T00:00:00", "wall_time_s": 12}
    assert rundir.resumed_meta(tmp_path / "missing.json") == {}


def test_a_key_only_the_stored_config_has_is_a_difference() -> None:
    requested = rundir.config_json(Config())
    stored = copy.deepcopy(requested)
    assert rundir.first_difference(requested, stored) is None
    stored["train"]["old_knob"] = 1
    assert rundir.first_difference(requested, stored) == "train.old_knob (1 in the run dir, None requested)"


def test_a_config_stored_before_ns_precision_existed_ran_it_in_bf16() -> None:
    bf16 = Config.model_validate({"optim": {"ns_precision": "bf16"}})
    stored = rundir.config_json(bf16)
    del stored["optim"]["ns_precision"]
    assert rundir.first_difference(rundir.config_json(bf16), stored) is None
    assert rundir.first_difference(rundir.config_json(Config()), stored) == \
        "optim.ns_precision ('bf16' in the run dir, 'auto' requested)"


def _interrupted_run(out: Path, cfg: Config) -> None:
    out.mkdir()
    rundir.write_json(out / rundir.CONFIG_FILE, rundir.config_json(cfg))
    rundir.write_json(out / rundir.META_FILE, {"status": "interrupted", "resumes": 0})


def test_resume_continues_from_the_previous_checkpoint_a_crash_left_mid_swap(tmp_path: Path) -> None:
    """A kill between a checkpoint swap's two renames leaves only checkpoints/.old-latest
    (checkpoint.find reads it): --resume continues from it rather than starting over."""
    cfg, out = Config(), tmp_path / "run"
    _interrupted_run(out, cfg)
    (out / rundir.CHECKPOINTS / ".old-latest").mkdir(parents=True)
    assert rundir.decide(out, cfg, resume=True, force=False) == rundir.Decision("resume")
    (out / rundir.CHECKPOINTS / ".old-latest").rename(out / rundir.CHECKPOINTS / "latest")
    assert rundir.decide(out, cfg, resume=True, force=False) == rundir.Decision("resume")
    (out / rundir.CHECKPOINTS / "latest").rmdir()
    assert rundir.decide(out, cfg, resume=True, force=False) == rundir.Decision("fresh")  # no checkpoint yet


def test_a_fresh_start_clears_every_file_of_the_earlier_run_and_nothing_else(tmp_path: Path) -> None:
    cfg, out = Config(), tmp_path / "run"
    _interrupted_run(out, cfg)
    (out / rundir.METRICS_FILE).write_text('{"step": 1}\n')
    for d in ("checkpoints/latest", "tensorboard", "wandb"):
        (out / d).mkdir(parents=True)
        (out / d / "f").write_text("x")
    (out / "notes.txt").write_text("the user's")
    rundir.prepare(out, rundir.Decision("fresh"))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["checkpoints", "notes.txt"]


def test_a_resume_keeps_the_run_and_drops_only_checkpoint_writes_cut_short(tmp_path: Path) -> None:
    cfg, out = Config(), tmp_path / "run"
    _interrupted_run(out, cfg)
    (out / rundir.METRICS_FILE).write_text('{"step": 1}\n')
    for d in ("latest", ".tmp-latest-4242", ".tmp-milestone-050-4242"):
        (out / rundir.CHECKPOINTS / d).mkdir(parents=True)
        (out / rundir.CHECKPOINTS / d / "state.json").write_text("{}")
    rundir.prepare(out, rundir.Decision("resume"))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "checkpoints", "checkpoints/latest", "checkpoints/latest/state.json", "config.json", "meta.json",
        "metrics.jsonl"]


# --------------------------------------------------------------------------- metrics.jsonl


def test_a_resume_drops_a_torn_last_metrics_line(tmp_path: Path) -> None:
    path = tmp_path / rundir.METRICS_FILE
    path.write_bytes(b'{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n{"step": 3, "lo')
    logs.truncate_metrics(path, last_step=3)
    assert path.read_bytes() == b'{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n'
    # a damaged line is the end: what follows it is dropped too
    path.write_bytes(b'{"step": 1}\n{"step": 2\n{"step": 3}\n')
    logs.truncate_metrics(path, last_step=3)
    assert path.read_bytes() == b'{"step": 1}\n'


def test_a_metrics_truncation_cut_short_leaves_the_old_file_whole(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / rundir.METRICS_FILE
    before = b"".join(b'{"step": %d}\n' % i for i in range(1, 6))
    path.write_bytes(before)
    real = Path.write_bytes

    def half_then_full(self: Path, data: bytes) -> int:
        real(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises(OSError):
        logs.truncate_metrics(path, last_step=3)
    monkeypatch.undo()
    assert path.read_bytes() == before


def test_metrics_lines_are_strict_json_with_null_for_non_finite_values(tmp_path: Path) -> None:
    log = logs.RunLog(tmp_path, Config(), total_steps=10, start_step=0, enabled=True)
    log.log({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "lr": float("-inf"), "tokens_per_s": 1e3})
    log.close()

    def no_constants(name: str) -> None:
        raise AssertionError(f"metrics.jsonl holds {name}: not strict JSON")

    (line,) = (tmp_path / rundir.METRICS_FILE).read_text().splitlines()
    assert json.loads(line, parse_constant=no_constants) == {"step": 1, "loss": None, "grad_norm": None, "lr": None,
                                                              "tokens_per_s": 1e3}


def _run_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_step: int, log_every: int) -> logs.RunLog:
    """A RunLog whose clock reads 0 s when it starts and 0.5 s at every later reading."""
    readings = iter([0.0])
    monkeypatch.setattr(logs, "time", types.SimpleNamespace(perf_counter=lambda: next(readings, 0.5)))
    cfg = Config.model_validate({"train": {"log_every": log_every}})
    return logs.RunLog(tmp_path, cfg, total_steps=10_000, start_step=start_step, enabled=True)


def test_the_eta_counts_the_steps_of_this_process_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Resumed at step 100, one step in 0.5 s: 2 steps/s, 9,899 steps left = 1:22:29."""
    log = _run_log(tmp_path, monkeypatch, start_step=100, log_every=1)
    log.log({"step": 101, "loss": 2.5, "tokens_per_s": 2e3})
    log.close()
    assert capsys.readouterr().out == "step 101/10000  loss 2.5  2.0k tok/s  eta 1:22:29\n"


def test_a_step_with_a_validation_loss_is_printed_off_the_logging_cadence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = _run_log(tmp_path, monkeypatch, start_step=0, log_every=1000)
    log.log({"step": 5, "loss": 2.5})
    assert capsys.readouterr().out == ""
    log.log({"step": 6, "loss": 2.5, "val_loss": 3.0})
    log.close()
    assert capsys.readouterr().out.startswith("step 6/10000  loss 2.5  val_loss 3  0.0k tok/s  eta ")
    assert len((tmp_path / rundir.METRICS_FILE).read_text().splitlines()) == 2  # the file has every step
