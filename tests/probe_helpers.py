"""A stand-in for the study's local runner in probe tests: same contract, no subprocesses
(each worker process would import torch again, seconds per run on 2 cores)."""

from __future__ import annotations

from typing import Any

import pytest


class _Runner:
    """The local runner's contract beyond `run`: `close` (its warm processes; none here)."""

    def close(self) -> None:
        pass


class InProcessRunner(_Runner):
    calls: list[str] = []

    def __init__(self, spec: Any) -> None:
        pass

    def run(self, jobs: Any, on_done: Any) -> None:
        from sanlab.study.runner import train_in_process

        for job in jobs:
            InProcessRunner.calls.append(job.run_id)
            on_done(job, train_in_process(job))


class GroupingInProcessRunner(_Runner):
    """The local runner's grouping (`LocalRunner._groups`: sweep points as members of one
    model), each group trained in this process by the group worker's own function
    (`sanlab.study.groups.train_group`), each single run by `train_in_process`."""

    groups: list[list[str]] = []

    def __init__(self, spec: Any) -> None:
        from sanlab.study.runner import LocalRunner

        self.local = LocalRunner(spec)

    def run(self, jobs: Any, on_done: Any) -> None:
        from dataclasses import asdict

        from sanlab.study.groups import train_group
        from sanlab.study.runner import Job, train_in_process

        jobs = [Job(**{**asdict(j), "threads": 1}) for j in jobs]
        for group in self.local._groups(list(jobs)):
            GroupingInProcessRunner.groups.append([j.run_id for j in group])
            for job in group:
                job.write()  # (as the local runner does: the jobs dir, where the run locks live)
            outcomes = [train_in_process(group[0])] if len(group) == 1 else train_group([asdict(j) for j in group])
            for job, outcome in zip(group, outcomes):
                on_done(job, outcome)


def use_grouping_runner(monkeypatch: pytest.MonkeyPatch) -> type[GroupingInProcessRunner]:
    monkeypatch.setattr("sanlab.probes.runner.LocalRunner", GroupingInProcessRunner)
    GroupingInProcessRunner.groups = []
    return GroupingInProcessRunner


def use_in_process_runner(monkeypatch: pytest.MonkeyPatch) -> type[InProcessRunner]:
    monkeypatch.setattr("sanlab.probes.runner.LocalRunner", InProcessRunner)
    InProcessRunner.calls = []
    return InProcessRunner


class ScriptedRunner(_Runner):
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
