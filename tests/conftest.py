"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _share_the_cores_among_workers() -> bool:
    """Under `pytest -n N` (what `make test` runs), N worker processes share the machine:
    each gets cores/N intra-op threads (at least one), and so does every process a test
    starts, through OMP_NUM_THREADS, which torch reads when it is imported. Without it each
    worker and each training subprocess would start a thread per core, N times over. A
    caller's own OMP_NUM_THREADS is kept. True when it set the variable."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))
    return True


CORES_SHARED = _share_the_cores_among_workers()


def _prepare(factory: pytest.TempPathFactory, name: str, overrides: list[str]) -> Path:
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare

    out = factory.mktemp(name) / "synth"
    prepare(apply_overrides(PrepareConfig, {}, overrides), out)
    return out


@pytest.fixture(scope="session")
def train_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared synth dir (~40k tokens, rows of 32, vocab 320), made once per session."""
    return _prepare(tmp_path_factory, "train-data", ["tokens=40000", "seq_len=32", "vocab_size=320", "val_frac=0.1"])


@pytest.fixture(scope="session")
def study_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared synth dir for study tests (20k tokens, rows of 32, vocab 512)."""
    return _prepare(tmp_path_factory, "study-data", ["tokens=20000", "seq_len=32", "vocab_size=512"])


@pytest.fixture(scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded synth corpus at the default prepare settings (2M tokens; ~5 s). Slow tests only."""
    return _prepare(tmp_path_factory, "default-data", ["tokens=2000000"])


@pytest.fixture
def load_benchmark(monkeypatch: pytest.MonkeyPatch):
    """A loader of the scripts in benchmarks/ by name ("bench_arms"): they are not a
    package, so their folder goes on sys.path for the test (and for the child processes
    a benchmark spawns, which import it by name)."""
    import importlib

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module


@pytest.fixture(scope="session")
def synthetic_report(tmp_path_factory: pytest.TempPathFactory):
    """The report of `tests/report_study.py`'s study, every figure drawn, built once per
    session: (Report, its dir)."""
    import report_study
    from sanlab.report.build import build

    root = tmp_path_factory.mktemp("synthetic-report")
    return build(report_study.study(root), root / "report"), root / "report"
