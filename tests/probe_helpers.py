"""A stand-in for the study's local runner in probe tests: same contract, no subprocesses
(each worker process would import torch again, seconds per run on 2 cores)."""

from __future__ import annotations

from typing import Any

import pytest


class InProcessRunner:
    calls: list[str] = []

    def __init__(self, spec: Any) -> None:
        pass

    def run(self, jobs: Any, on_done: Any) -> None:
        from sanlab.study.runner import train_in_process

        for job in jobs:
            InProcessRunner.calls.append(job.run_id)
            on_done(job, train_in_process(job))


def use_in_process_runner(monkeypatch: pytest.MonkeyPatch) -> type[InProcessRunner]:
    monkeypatch.setattr("sanlab.probes.runner.LocalRunner", InProcessRunner)
    InProcessRunner.calls = []
    return InProcessRunner


class ScriptedRunner:
    """A runner that trains nothing: each job's outcome is `ScriptedRunner.outcome(job)`
    (the probe's decisions and arithmetic, tested on numbers chosen to tell them apart)."""

    calls: list[str] = []
    outcome: Any = None  # Callable[[Job], dict]: the outcome dict the runner would return

    def __init__(self, spec: Any) -> None:
        pass

    def run(self, jobs: Any, on_done: Any) -> None:
        for job in jobs:
            ScriptedRunner.calls.append(job.run_id)
            on_done(job, ScriptedRunner.outcome(job))


def use_scripted_runner(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> type[ScriptedRunner]:
    monkeypatch.setattr("sanlab.probes.runner.LocalRunner", ScriptedRunner)
    ScriptedRunner.calls = []
    ScriptedRunner.outcome = staticmethod(outcome)
    return ScriptedRunner


def completed(val: float, test: float, *, correct: int | None = None, total: int = 100,
              val_loss: float = 1.0) -> dict[str, Any]:
    """A finished probe run's outcome with these accuracies."""
    return {"status": "completed", "wall_s": 0.0, "error": None,
            "final": {"val_accuracy": val, "test_accuracy": test, "val_loss": val_loss,
                      "test_correct": round(test * total) if correct is None else correct, "test_total": total}}
