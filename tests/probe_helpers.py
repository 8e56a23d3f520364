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
