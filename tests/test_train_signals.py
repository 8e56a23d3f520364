"""The stop flag: the first signal asks for a clean stop, a second one exits at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sanlab.errors import EXIT_INTERRUPTED

SCRIPT = """
import os, signal, time
from sanlab.train.signals import StopSignal
with StopSignal() as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)  # a copy within a second: still the first request
    time.sleep(0.05)
    print("requested", stop.requested, flush=True)
    time.sleep(1.1)
    os.kill(os.getpid(), signal.SIGTERM)  # a real second signal
    time.sleep(5)
    print("still running", flush=True)
"""


def test_second_signal_exits_at_once() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED
    assert proc.stdout == "requested True\n"


def test_handlers_are_restored() -> None:
    import signal

    from sanlab.train.signals import StopSignal

    before = signal.getsignal(signal.SIGTERM)
    with StopSignal():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# `sanlab train` as its own process (sanlab.cli.entry), with SIGTERMs sent at chosen points:
# the tiny run of the train tests on the data dir given as argv[1], into argv[2].
TRAIN_SCRIPT = """
import atexit, os, signal, sys, time
import sanlab.train.cli as train_cli
import sanlab.train.trainer as trainer

def term(pause=0.2):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(pause)

when = sys.argv[3]
if when == "after":  # the run has completed: while its last line is printed, twice, and at shutdown
    real = train_cli.final_line
    def final_line(meta, out):
        term(1.2)
        term()
        return real(meta, out)
    train_cli.final_line = final_line
    atexit.register(term)
elif when == "before":  # while the run dir is read, before the run's own handlers are installed
    real_decide = trainer.rundir.decide
    def decide(*a, **k):
        term()
        return real_decide(*a, **k)
    trainer.rundir.decide = decide
sys.argv = ["sanlab", "train", "--out", sys.argv[2], f"data.dir={sys.argv[1]}", "model.d_model=32",
            "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=320",
            "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=16", "train.steps=3",
            "train.eval_every=0", "train.log_every=1000"]
from sanlab.cli import entry
entry()
"""


def _train_with_signals(data: Path, out: Path, when: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(data), str(out), when],
                          capture_output=True, text=True, timeout=300)


def test_a_sigterm_after_the_run_completed_changes_nothing(train_data_dir: Path, tmp_path: Path) -> None:
    """Signals while the last line is printed (two, 1.2 s apart: a 'second signal') and
    during the interpreter's shutdown: the completed run exits 0, its line printed."""
    proc = _train_with_signals(train_data_dir, tmp_path / "run", "after")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.splitlines()[-1].startswith("completed: ")
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["status"] == "completed"


def test_a_sigterm_before_the_run_started_stops_it_with_a_checkpoint(train_data_dir: Path, tmp_path: Path) -> None:
    """A signal while the run dir is read (before the run's handlers exist) reaches the run:
    it stops at the first step boundary, checkpointed, exit 4, and resumes."""
    proc = _train_with_signals(train_data_dir, tmp_path / "run", "before")
    assert proc.returncode == EXIT_INTERRUPTED, (proc.returncode, proc.stderr[-2000:])
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["status"] == "interrupted" and meta["final"]["steps"] == 1
    state = json.loads((tmp_path / "run" / "checkpoints" / "latest" / "state.json").read_text())
    assert state["step"] == 1
