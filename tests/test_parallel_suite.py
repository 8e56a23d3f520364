"""`make test` runs the suite in pytest-xdist workers (`-n auto`); tests/conftest.py gives
each worker, and each process a test starts, its share of the cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CORES_SHARED, _share_the_cores_among_workers

ROOT = Path(__file__).resolve().parents[1]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.parametrize("workers,preset,expected", [
    ("2", None, lambda c: str(max(1, c // 2))),
    ("64", None, lambda c: "1"),                 # more workers than cores: one thread each
    ("2", "3", lambda c: "3"),                   # the caller's own setting is kept
    ("1", None, lambda c: None),                 # one worker: torch's default, nothing set
    (None, None, lambda c: None),                # no xdist: nothing set
])
def test_the_cores_are_shared_among_the_workers(monkeypatch, workers, preset, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for key, value in (("PYTEST_XDIST_WORKER_COUNT", workers), ("OMP_NUM_THREADS", preset)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert _share_the_cores_among_workers() is (expected(_cores()) is not None and preset is None)
    assert os.environ.get("OMP_NUM_THREADS") == expected(_cores())


def test_a_worker_and_the_processes_it_starts_run_cores_over_workers_threads():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        pytest.skip("runs under pytest -n N with N >= 2 (make test)")
    share = int(os.environ["OMP_NUM_THREADS"])
    if CORES_SHARED:  # not the caller's own OMP_NUM_THREADS
        assert share == max(1, _cores() // workers)
    assert torch.get_num_threads() == share
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) == share


def test_make_test_runs_the_suite_in_workers():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ntest: setup\n", 1)[1].split("\n\n", 1)[0]
    assert "-m pytest" in recipe and "-n auto" in recipe and "--maxprocesses 8" in recipe
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()
