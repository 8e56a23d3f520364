"""`study run` trains an arm's sweep points and seeds as members of one batched model
(`sanlab.study.groups`): the same records as solo runs (within the members' tolerance),
resume after a kill, and `study plan` shows the groups."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from sanlab.study.groups import plan_groups
from sanlab.study.orchestrate import Study
from sanlab.study.plan import build_arms, sweep_runs
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore
from test_members import RTOL
from test_study_e2e import SPEC


def _spec(data: Path, members: int | str) -> StudySpec:
    raw = tomllib.loads(SPEC.format(data=data))
    raw["runner"]["members"] = members
    return StudySpec.model_validate(raw)


def _config(run) -> dict:  # noqa: ANN001
    return json.loads(run.config.model_dump_json())


def test_plan_groups_an_arms_sweep_points_and_nothing_else(study_data_dir: Path) -> None:
    spec = _spec(study_data_dir, "auto")
    san, iso = build_arms(spec)
    runs = [*sweep_runs(spec, san, "muon", [0.5, 1, 2], str(study_data_dir)),
            *sweep_runs(spec, iso, "muon", [1, 2], str(study_data_dir))]
    configs = [_config(r) for r in runs]
    assert plan_groups(configs, "auto") == [[0, 1, 2], [3, 4]]
    assert plan_groups(configs, 2) == [[0], [1, 2], [3, 4]]  # at most 2 a group, split evenly
    assert plan_groups(configs, 1) == [[i] for i in range(5)]
    assert plan_groups(configs, "auto", workers=4) == [[0, 1, 2], [3, 4]]  # no group split below 2
    four = [_config(r) for r in sweep_runs(spec, san, "muon", [0.25, 0.5, 1, 2], str(study_data_dir))]
    assert plan_groups(four + configs[3:], "auto", workers=3) == [[0, 1], [2, 3], [4, 5]]  # the workers kept busy
    assert plan_groups(four + configs[3:], "auto", workers=2) == [[0, 1, 2, 3], [4, 5]]
    configs[1]["model"]["mixer"] = "mixit"  # members refuse it: solo
    assert plan_groups(configs, "auto") == [[0, 2], [1], [3, 4]]
    wide = [dict(c, model=dict(c["model"], d_model=512, n_heads=8, n_kv_heads=4)) for c in configs[3:]]
    assert plan_groups(wide, "auto") == [[0], [1]]  # "auto": too wide to pay
    assert plan_groups(wide, 8) == [[0, 1]]


def test_which_train_fns_can_train_members() -> None:
    """The trainer's runs, and runs of a train_fn that says how a member's run finishes
    (the probe suite's scoring), may train as members; any other train_fn, or one that
    does not resolve, trains solo."""
    from sanlab.probes.runner import TRAIN_FN, score_run
    from sanlab.study.groups import DEFAULT_TRAIN_FN, groupable, resolve

    assert groupable(DEFAULT_TRAIN_FN) and groupable(TRAIN_FN)
    assert resolve(TRAIN_FN).finish_member is score_run
    assert not groupable("study_fakes:train")  # (a stand-in trainer: no finishing step)
    assert not groupable("no_such_module:train") and not groupable("sanlab.probes.runner:no_such_fn")


def test_runner_members_is_validated(study_data_dir: Path) -> None:
    for bad in (0, -1, "many", True, 2.5):
        with pytest.raises(ValueError, match=r'runner.members must be "auto" or an integer >= 1'):
            _spec(study_data_dir, bad)


def _records(out: Path) -> dict[str, dict]:
    return ResultStore(out).runs()


def _assert_same_results(grouped: dict[str, dict], solo: dict[str, dict]) -> None:
    assert grouped.keys() == solo.keys()
    for rid, r in solo.items():
        g = grouped[rid]
        assert g["status"] == r["status"] and g["config"] == r["config"], rid
        for k in ("val_loss", "train_loss"):
            assert g["final"][k] == pytest.approx(r["final"][k], rel=RTOL["fp32"]), (rid, k)
        assert g["final"]["tokens"] == r["final"]["tokens"]


@pytest.fixture(scope="module")
def solo_study(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("solo") / "study"
    assert Study(_spec(study_data_dir, 1), out).run() == 0
    for rid in _records(out):
        assert "members" not in json.loads((out / "runs" / rid / "meta.json").read_text())
    return _records(out)


def test_a_grouped_study_records_what_a_solo_study_does(study_data_dir: Path, tmp_path: Path,
                                                        solo_study: dict[str, dict]) -> None:
    out = tmp_path / "study"
    assert Study(_spec(study_data_dir, "auto"), out).run() == 0
    records = _records(out)
    _assert_same_results(records, solo_study)
    batches = {rid: json.loads((out / "runs" / rid / "meta.json").read_text()).get("members", {}).get("batch", 1)
               for rid in records}
    assert sorted(batches.values()).count(2) >= 4  # both arms' sweep pairs trained as members
    for rid, r in records.items():  # the record says how many members shared the step
        assert r.get("members", 1) == batches[rid], rid


def test_throughput_counts_a_group_as_what_its_process_trained() -> None:
    from sanlab.study.table import throughput

    records = {"a": {"arm": "san", "tokens_per_s": 1000.0, "members": 4},
               "b": {"arm": "san", "tokens_per_s": 3000.0},
               "c": {"arm": "ffn", "tokens_per_s": 500.0, "members": 1}}
    assert throughput(records) == {"san": 3500.0, "ffn": 500.0}


@pytest.mark.slow
def test_a_killed_grouped_study_resumes(study_data_dir: Path, tmp_path: Path, solo_study: dict[str, dict]) -> None:
    raw = SPEC.format(data=study_data_dir) + 'members = "auto"\n'
    (tmp_path / "spec.toml").write_text(raw)
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "sanlab", "study", "run", str(tmp_path / "spec.toml"), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    while not list((out / "runs").glob("*/checkpoints/latest/state.json")):  # a group is under way
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert time.time() < deadline
        time.sleep(0.05)
    import os

    os.killpg(proc.pid, signal.SIGKILL)  # the study and its group workers, at once
    proc.wait()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    _assert_same_results(_records(out), solo_study)


def test_study_plan_shows_the_groups(study_data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text(SPEC.format(data=study_data_dir))
    plan = subprocess.run([sys.executable, "-m", "sanlab", "study", "plan", str(tmp_path / "spec.toml"), "--no-timing",
                           "--format", "csv"], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "Member groups" in plan.stdout or "members" in plan.stdout
    lines = [ln for ln in plan.stdout.splitlines() if ln.startswith("sweep,2,")]
    assert len(lines) == 2, plan.stdout  # the SAN's and the iso-param arm's two sweep points
    off = subprocess.run([sys.executable, "-m", "sanlab", "study", "plan", str(tmp_path / "spec.toml"),
                          "--no-timing", "--format", "csv", "runner.members=1"], capture_output=True, text=True,
                         timeout=120)
    assert off.returncode == 0 and not [ln for ln in off.stdout.splitlines() if ln.startswith("sweep,2,")]


def test_plan_total_spreads_groups_not_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's total with member groups: each group one unit (its process started once,
    its runs without their start summed / the speed-up), spread over the workers longest
    first, the sweep before the rest, after the once-only start-up."""
    from types import SimpleNamespace

    from sanlab.study import groups

    class Cfg:
        def model_dump_json(self) -> str:
            return "{}"

    secs = {"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0, "s": 4.0}
    start = 2.0  # each process's start, inside a run's seconds: a group's process starts once
    runs = [SimpleNamespace(run_id=k, phases=("sweep",) if k == "s" else ("final",), config=Cfg()) for k in secs]
    plan = SimpleNamespace(runs=runs, run_seconds=lambda r, start=True: secs[r.run_id] - (0.0 if start else 2.0),
                           start_seconds=lambda r: start, startup_seconds=1.5)
    monkeypatch.setattr(groups, "plan_groups", lambda cfgs, setting, workers: (
        [[0, 1, 2], [3]] if len(cfgs) == 4 else [[0]]))
    group = start + 3 * (10.0 - start) / groups.MEMBER_SPEEDUP
    # the once-only start-up (warm processes), then final: a group of three (started once, its
    # runs summed / speed-up) and a solo run (10) on two workers; sweep: 4
    assert groups.plan_seconds(plan, "auto", 2) == pytest.approx(1.5 + 4.0 + group)
    # one worker: everything one after another
    assert groups.plan_seconds(plan, "auto", 1) == pytest.approx(1.5 + 4.0 + group + 10.0)
    rows = groups.plan_table_rows(plan, "auto", 2)
    assert [r[1] for r in rows] == [["a", "b", "c"]] and rows[0][2] == pytest.approx(group)


def test_the_streamed_estimate_releases_a_cells_final_runs_when_its_sweep_ends() -> None:
    """`stream_makespan`: two workers; the SAN's sweep (1 s) ends long before the iso-FLOP
    arm's (9 s), so its final run (8 s) runs beside that sweep: 11 s, against 9 + 8 = 17 s
    with a barrier between the phases. The noise arm's final run waits for the reference's
    sweep; a unit of sweep points goes before a longer final unit."""
    from types import SimpleNamespace

    from sanlab.study.plan import makespan, stream_makespan

    def run(arm: str, phase: str) -> SimpleNamespace:
        return SimpleNamespace(arm=arm, optimizer="muon", data="", phases=[phase])

    units = [(1.0, [run("san", "sweep")]), (9.0, [run("iso_flop", "sweep")]),
             (8.0, [run("san", "final")]), (2.0, [run("iso_flop", "final")])]
    assert stream_makespan(units, 2) == pytest.approx(11.0)
    # a final run never starts before its cell's sweep ends, even with a worker free
    assert stream_makespan([(9.0, [run("iso_flop", "sweep")]), (2.0, [run("iso_flop", "final")])], 2) == 11.0
    assert makespan([1.0, 9.0], 2) + makespan([8.0, 2.0], 2) == pytest.approx(17.0)
    # the noise arm (no sweep of its own) trains at the reference's lock: it waits for the SAN's sweep
    noise = units + [(5.0, [run("san_rms", "noise")])]
    assert stream_makespan(noise, 2, "san", "muon") == pytest.approx(11.0 + 5.0 - 2.0)  # 1→9 san final, 9→14 noise
    # one worker: sweep points first (1 + 9), then the final runs longest first
    assert stream_makespan(units, 1) == pytest.approx(20.0)
    # as the runner ranks them: at 1 s the SAN's final run (10 s) is ready, yet the waiting
    # iso-depth sweep point (0.5 s) goes first (1→1.5), the final run after it: 11.5 s, not 11
    ranked = [(3.0, [run("iso_flop", "sweep")]), (1.0, [run("san", "sweep")]), (0.5, [run("iso_depth", "sweep")]),
              (10.0, [run("san", "final")])]
    assert stream_makespan(ranked, 2) == pytest.approx(11.5)
