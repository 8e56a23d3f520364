"""Verdicts that say no more than the numbers hold (issue 49, item 9), as a user meets them:
from a working directory of their own, with relative paths."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.study.orchestrate import Study

TESTS = Path(__file__).parent
ROOT = TESTS.parent

SPEC = """name = "one-seed"
seeds = [1]
[data]
dir = "data"
seq_len = 32
[model]
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[matching]
arms = ["iso_depth"]
policy = "nearest"
tolerance = 0.5
[sweep]
enabled = false
[final]
tokens = ["2K"]
[noise]
enabled = false
[runner]
workers = 1
threads = 1
"""


def test_a_one_seed_gap_without_a_floor_has_no_noise_estimate(study_data_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """One seed pair and no noise pair: nothing estimates the noise, so the gap table says
    so instead of naming the arm that is ahead (it said "san ahead (no floor yet)")."""
    shutil.copytree(study_data_dir, tmp_path / "data")
    (tmp_path / "spec.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr("sanlab.commands.study.Study", functools.partial(Study, train_fn="study_fakes:train"))
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    capsys.readouterr()
    assert main(["study", "table", "runs/s", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    gaps = out.split("vs noise floor\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(gaps) == 1 and gaps[0].startswith("iso_depth") and gaps[0].endswith(",no noise estimate"), out
    assert " ahead" not in "\n".join(gaps)
