"""A sweep's lock read against the noise floor: the lock's margin over the runner-up LR, and
the warning when the margin is within the floor (the sweep cannot tell the two LRs apart,
so noise chose the final runs' LR). The study runs on the stand-in trainer
(tests/study_fakes.py), whose losses are known: 3 + c·log2(m / optimum)² + shifts, the
noise pair 0.0015 apart (F = 0.0015), so a neighbour of the optimum is c behind it."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.study.orchestrate import Study
from sanlab.study.table import SweepRow, unresolved_lock

TESTS = Path(__file__).parent
FLOOR = 0.0015  # study_fakes: the rms-norm control arm's shift, the same for every seed

SPEC = """name = "flat"
seeds = [1, 2]
optimizers = ["muon"]
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
arms = ["iso_param"]
policy = "nearest"
tolerance = 0.5
[sweep]
tokens = "1K"
[final]
tokens = ["2K"]
[runner]
workers = 1
threads = 1
"""


def _row(losses: dict[float, float | None], done: bool = True, best: float | None = 1.0) -> SweepRow:
    return SweepRow("san", "muon", 0.02, losses, best, done, False)


def test_the_margin_is_the_runner_up_loss_minus_the_best() -> None:
    r = _row({0.5: 3.010, 1.0: 3.000, 2.0: 3.004, 4.0: None})
    assert r.margin == pytest.approx(0.004, abs=1e-12) and r.runner_up() == 2.0
    assert r.to_dict()["margin"] == r.margin
    # a diverged point is no runner-up; before the lock, and with one finished point, no margin
    assert _row({1.0: 3.0, 2.0: None}).margin is None and _row({1.0: 3.0, 2.0: None}).runner_up() is None
    assert _row({0.5: 3.01, 1.0: 3.0}, done=False).margin is None
    assert _row({0.5: 3.01, 1.0: 3.0}, best=None).margin is None


@pytest.mark.parametrize(("margin", "floor", "unresolved"), [
    (0.0010, FLOOR, True),    # within F
    (0.0015, FLOOR, True),    # |x| ≤ F counts as noise (the rule's boundary)
    (0.0016, FLOOR, False),   # beyond F
    (0.0010, None, False),    # no floor measured yet: nothing is read against it
])
def test_a_lock_is_unresolved_by_the_noise_rule(margin: float, floor: float | None, unresolved: bool) -> None:
    r = _row({0.5: margin, 1.0: 0.0, 2.0: 2 * margin})  # around 0: the margin exact
    assert unresolved_lock(r, floor) is unresolved


def _run(tmp_path: Path, study_data_dir: Path, monkeypatch: pytest.MonkeyPatch, curvature: float) -> None:
    shutil.copytree(study_data_dir, tmp_path / "data")
    (tmp_path / "spec.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SANLAB_FAKE_CURVATURE", str(curvature))
    monkeypatch.setattr("sanlab.commands.study.Study", functools.partial(Study, train_fn="study_fakes:train"))
    assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0


def test_a_flat_sweep_is_flagged_in_the_table_the_json_and_the_report(
        study_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """c = 0.001 < F: each lock beats its neighbours by 0.001 nats, and each cell says so,
    from a user's own directory with relative paths."""
    _run(tmp_path, study_data_dir, monkeypatch, 0.001)
    capsys.readouterr()
    assert main(["study", "table", "runs/s"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # the SAN's optimum is 1× of 0.02; its neighbours 0.5× and 2× tie, the lower LR is named
    assert ("warning: san muon: lock 0.02 beats 0.01 by 0.0010 nats, within the noise floor (F = 0.0015): "
            "at 1K tokens the sweep does not tell the two apart") in out, out
    assert "warning: iso_param muon: lock 0.16 beats 0.08 by 0.0010 nats, within the noise floor (F = 0.0015)" in out
    assert main(["study", "table", "runs/s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["arm"]: round(r["margin"], 6) for r in data["sweep"]} == {"san": 0.001, "iso_param": 0.001}
    assert {r["arm"]: r["within_floor"] for r in data["sweep"]} == {"san": True, "iso_param": True}
    assert main(["report", "runs/s"]) == 0
    md = " ".join(Path("runs/s/report/report.md").read_text().split())
    assert "san muon: lock 0.02 beats 0.01 by 0.0010 nats, within the noise floor (F = 0.0015)" in md


def test_a_sweep_that_resolves_its_lock_is_not_flagged(study_data_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """c = 0.002 > F: the same study, every lock ahead of its neighbours beyond the floor."""
    _run(tmp_path, study_data_dir, monkeypatch, 0.002)
    capsys.readouterr()
    assert main(["study", "table", "runs/s"]) == 0
    out = capsys.readouterr().out
    assert "within the noise floor" not in out and "LR sweep" in out, out
    assert main(["study", "table", "runs/s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["arm"]: r["within_floor"] for r in data["sweep"]} == {"san": False, "iso_param": False}


@pytest.mark.parametrize(("cell", "losses", "margin"), [
    ("SAN Muon", {0.5: 2.248, 1: 2.245, 2: 2.251}, 0.003),
    ("FFN Muon", {0.5: 2.223, 1: 2.224, 2: 2.216, 4: 2.237}, 0.007),
    ("SAN AdamW", {0.5: 2.361, 1: 2.293, 2: 2.267, 4: 2.321}, 0.026),
    ("FFN AdamW", {0.5: 2.305, 1: 2.254, 2: 2.230, 4: 2.219, 8: 2.199, 16: 2.216}, 0.017),
])
def test_the_papers_anchor_sweep_resolves_every_lock(cell: str, losses: dict[float, float], margin: float) -> None:
    """SPEC §1.4's anchor sweep against its noise floor (+0.0015 nats): every lock beats its
    runner-up beyond F, so none of the paper's cells would be flagged."""
    best = min(losses, key=lambda m: losses[m])
    r = SweepRow(cell, "", 1.0, {float(m): v for m, v in losses.items()}, float(best), True, False)
    assert r.margin == pytest.approx(margin, abs=1e-9) and not unresolved_lock(r, FLOOR)


@pytest.mark.parametrize("lock_at", [None, 64])
def test_on_a_data_axis_each_swept_value_reads_its_locks_against_the_floor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        lock_at: int | None) -> None:
    """A data axis (synth.facts = 64, 128): each value's sweep (or `sweep.lock_at`'s one
    sweep) is read against the noise floor measured at that value, and its warning names the
    value. Multipliers 1× and 4× with c = 0.0003: the SAN's lock (1×) beats 4× and the
    standard arm's (4×) beats 1× by 4c = 0.0012 < F = 0.0015."""
    from rich.console import Console

    import test_study_axis as tsa

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SANLAB_FAKE_AXIS", "1")
    monkeypatch.setenv("SANLAB_FAKE_CURVATURE", "0.0003")
    spec = tsa.make_spec(sweep={"lock_at": lock_at} if lock_at else {})
    monkeypatch.chdir(tmp_path)
    assert Study(spec, Path("study"), console=Console(file=open(os.devnull, "w")),
                 train_fn="study_fakes:train").run() == 0
    capsys.readouterr()
    assert main(["study", "table", "study"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    swept = [64] if lock_at else [64, 128]
    for facts in swept:
        for arm, lock, other in (("san", "0.02", "0.08"), ("iso_param", "0.16", "0.04")):
            assert (f"warning: {arm} muon at synth.facts={facts}: lock {lock} beats {other} by 0.0012 nats, "
                    "within the noise floor (F = 0.0015)") in out, out
    assert out.count("within the noise floor") == 2 * len(swept)
