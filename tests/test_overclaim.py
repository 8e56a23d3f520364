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


def _claims_block(readme: str) -> str:
    return readme.split("<!-- records:BEGIN claims -->", 1)[1].split("<!-- records:END claims -->", 1)[0]


def test_the_region_identity_is_a_check_apart_from_the_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity holds by construction: the README keeps it, in a table of its own
    ("holds"), and no row of the claims table, so no count of reproduced claims, has it."""
    shutil.copytree(ROOT / "records" / "2026-12-01-synth", tmp_path / "records" / "synth")
    monkeypatch.chdir(tmp_path)
    readme = Path("records/synth/README.md")
    readme.write_text(readme.read_text().replace(_claims_block(readme.read_text()), "\nstale\n"))
    assert main(["record", "readme", "records/synth"]) == 0
    block = _claims_block(readme.read_text())
    claims, checks = block.split("Checks of the analysis", 1)
    claim_rows = [r for r in claims.splitlines() if r.startswith("| ") and not r.startswith("| claim |")]
    assert len(claim_rows) == 5 and not any("region Δs" in r for r in claim_rows)
    assert [r.rsplit("| **", 1)[1] for r in claim_rows if "**reproduced**" in r] == ["reproduced** |"] * 3
    (check,) = [r for r in checks.splitlines() if r.startswith("| token-weighted region Δs")]
    assert check.endswith("| **holds** |")
    assert "- region identity (a check of the analysis, exact by construction): holds when" in checks
