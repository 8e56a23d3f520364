"""Slow: the probes learn what SPEC §2 says a standard 2-layer model can learn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from probe_helpers import use_in_process_runner

from sanlab.cli import main


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    use_in_process_runner(monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("task, items", [
    # the --quick retrieval (up to 8 pairs, 16 keys, 16 values, 4000 examples) at 1000 steps:
    # at --quick's 500, one LR is at the edge of the learning transition (measured: seeds
    # 1-7 gave test accuracy 0.41-1.00, two of seven below 0.95, and which ones moved with
    # fp32 rounding); at 1000 the seeds that failed reach >= 0.996
    ("retrieval", ["task.m_max=8", "train.steps=1000"]),
    ("modadd", ["task.p=31"]),  # the --quick modular addition
])
def test_standard_two_layer_model_learns_retrieval_and_modadd(task: str, items: list[str], tmp_path: Path,
                                                              in_process: Any) -> None:
    rc = main(["probe", task, "--arms", "standard", "--quick", "sweep.grid=[1]", "sweep.max_extensions=0",
               *items, "--out", str(tmp_path)])
    assert rc == 0
    cell = json.loads((tmp_path / f"probe-{task}.json").read_text())["cells"][0]
    config = json.loads((tmp_path / cell["points"][0]["run_dir"] / "config.json").read_text())
    assert config["model"]["n_layers"] == 2 and config["model"]["state_mixer"] == "swiglu"
    assert cell["test_accuracy"] >= 0.95, cell
