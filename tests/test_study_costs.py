"""The order in which the local runner starts a study's runs: longest first, by each run's
seconds at its arm's measured speed once the study has measured it (`run_costs`), else by
training FLOPs."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from sanlab.study.orchestrate import Study, run_costs

from test_study_orchestrate import calls, make_spec

TESTS = Path(__file__).parent


def _run(arm: str, tokens: int, flops: float) -> SimpleNamespace:
    return SimpleNamespace(run_id=f"{arm}-{tokens}", arm=arm, tokens=tokens, flops_per_token=flops)


def _record(arm: str, flops: float, tokens_per_s: float | None, members: int | None = None) -> dict:
    r = {"arm": arm, "flops_per_token": flops, "tokens_per_s": tokens_per_s}
    return {**r, "members": members} if members else r


def test_nothing_measured_costs_training_flops() -> None:
    runs = [_run("san", 1000, 3.0), _run("iso_flop", 1000, 3.1)]
    assert run_costs(runs, {}) == [3000.0, 3100.0]
    assert run_costs(runs, {"x": _record("san", 3.0, None)}) == [3000.0, 3100.0]


def test_measured_arms_cost_their_seconds_and_others_the_nearest_arm_scaled_by_flops() -> None:
    records = {
        "a": _record("san", 3.0, 1000.0),            # the SAN: fewer FLOPs, but slower
        "b": _record("san", 3.0, 3000.0),            # its mean: 2,000 tokens/s
        "c": _record("iso_flop", 3.1, 2500.0, 2),    # a member of a group of 2: the group's 5,000
        "d": _record("iso_depth", 8.0, 1500.0),
    }
    runs = [_run("san", 10_000, 3.0), _run("iso_flop", 10_000, 3.1), _run("san_rms", 10_000, 3.0),
            _run("iso_depth", 10_000, 8.0), _run("wide", 10_000, 5.2), _run("odd", 10_000, 0.0)]
    costs = run_costs(runs, records)
    assert costs[0] == pytest.approx(10_000 / 2000)
    assert costs[1] == pytest.approx(10_000 / 5000)
    assert costs[2] == pytest.approx(10_000 / 2000)  # unmeasured, the SAN's FLOPs: the SAN's speed
    assert costs[3] == pytest.approx(10_000 / 1500)
    # nearest in FLOPs by ratio to 5.2 is iso_depth's 8.0 (1.54×, not iso_flop's 3.1: 1.68×,
    # though nearer in difference), its 1,500 tokens/s scaled by 8.0 / 5.2
    assert costs[4] == pytest.approx(10_000 / (1500 * 8.0 / 5.2))
    assert costs[5] == 0.0
    # by FLOPs the SAN would start after its iso-FLOP partner; by measured time, before it
    assert costs[0] > costs[1]


def test_final_runs_start_longest_first_by_the_sweeps_measured_speed(study_data_dir: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, so the stand-in trainer's calls are the start order. The SAN reports
    1,000 tokens/s and the standard arms 100,000 in the sweep: every final SAN run, and
    the noise pair (the SAN's FLOPs), starts before the standard arms' (by FLOPs the
    iso-depth runs, the costliest, would start first)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SANLAB_FAKE_TOKENS_PER_S", "san=1000,ffn=100000")
    monkeypatch.chdir(tmp_path)
    spec = make_spec(study_data_dir, runner={"workers": 1, "threads": 1, "members": 1})
    assert Study(spec, Path("study"), console=Console(width=200), train_fn="study_fakes:train").run() == 0
    finals = [c for c in calls(Path("study")) if c.split("-")[-2] == "2K"]
    assert len(finals) == 10, finals
    first = finals[:4]
    assert all(c.startswith(("san-", "san_rms-")) for c in first), finals
    assert all(not c.startswith(("san-", "san_rms-")) for c in finals[4:]), finals
