"""The stop flag: the first signal asks for a clean stop, a second one exits at once."""

from __future__ import annotations

import subprocess
import sys

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
