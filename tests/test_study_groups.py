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

from sanlab.configbase import apply_overrides
from sanlab.errors import ConfigError
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
    from sanlab.study import groups

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
    widest = [dict(c, model=dict(c["model"], d_model=groups.AUTO_MAX_D, n_heads=8, n_kv_heads=4)) for c in configs[3:]]
    assert groups.AUTO_MAX_D == 256 and plan_groups(widest, "auto") == [[0, 1]]  # "auto" groups up to d 256
    # an integer setting is the user's: not split to fill the workers, as "auto" is above
    assert plan_groups(four + configs[3:], 4, workers=3) == [[0, 1, 2, 3], [4, 5]]


def test_balance_cuts_groups_where_that_ends_the_batch_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    """`balance`: the runner gives a free worker the costliest unit left (a group costs its
    runs' sum / MEMBER_SPEEDUP); a group is cut into even parts, the best cut first, while
    a cut shortens the batch by more than BALANCE_GAIN."""
    from sanlab.study import groups
    from sanlab.study.groups import balance

    assert groups.MEMBER_SPEEDUP == 1.05 and groups.BALANCE_GAIN == 0.05  # (the numbers below)
    # one group of four equal runs on two workers: 4 / 1.05 = 3.81 on one, the other idle;
    # halves 2 / 1.05 = 1.90 each; a solo run and a group of three, or four solo runs, 2.0
    assert balance([[0, 1, 2, 3]], [1.0] * 4, 2) == [[0, 1], [2, 3]]
    # the demo's first sweep round on a 2-core AVX2 CPU, seconds a run: iso-depth 26 / 3,
    # iso-FLOP 13 / 3, SAN 12 / 3, iso-param 9 / 3, each arm a group of three. As they are:
    # iso-depth (24.76) on one worker, iso-FLOP (12.38) + SAN (11.43) + iso-param (8.57) on
    # the other, 32.38. The best cut: a SAN run solo (4) and its other two a group (7.62):
    # iso-depth + the SAN run 28.76, iso-FLOP + iso-param + the SAN pair 28.57: 28.76 (-11%);
    # no further cut gains 5%.
    costs = [26 / 3] * 3 + [13 / 3] * 3 + [4.0] * 3 + [3.0] * 3
    four = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert balance(four, costs, 2) == [[0, 1, 2], [3, 4, 5], [6], [7, 8], [9, 10, 11]]
    assert balance(four, [1.0] * 12, 2) == four  # four equal groups on two workers: nothing to gain
    # a solo run has no members' speed-up: runs of 1, 1, 2 as a group 3.81 | 1; cut as [0] and
    # [1, 2]: 3 / 1.05 = 2.86 | 1 + 1; all solo, 2 + 1 | 1 + 1 = 3.0 (with the speed-up, 2.86)
    assert balance([[0, 1, 2], [3]], [1.0, 1.0, 2.0, 1.0], 2) == [[0], [1, 2], [3]]
    assert balance(four, costs, 1) == four  # one worker: a cut only loses the members' speed-up
    assert balance(four, [0.0, *costs[1:]], 2) == four  # a run of unknown cost: as they are
    monkeypatch.setattr(groups, "BALANCE_GAIN", 0.2)  # the 11% is below it
    assert balance(four, costs, 2) == four


def test_plan_groups_balances_by_the_runs_costs(study_data_dir: Path, tmp_path: Path) -> None:
    """With costs (the runner's, for a batch that starts on idle workers) "auto" groups are
    balanced; an integer setting is the user's and is kept. The SAN's three sweep points
    (1 each) and the iso-param arm's two (5 each) on two workers: as groups 2.86 and 9.52;
    the iso-param pair cut, 5 | 5 + 2.86 = 7.86; then the SAN's, 5 + 1.90 | 5 + 1: 6.90."""
    from sanlab.study.runner import Job, LocalRunner
    from sanlab.study.spec import RunnerSpec

    spec = _spec(study_data_dir, "auto")
    san, iso = build_arms(spec)
    runs = [*sweep_runs(spec, san, "muon", [0.5, 1, 2], str(study_data_dir)),
            *sweep_runs(spec, iso, "muon", [1, 2], str(study_data_dir))]
    configs = [_config(r) for r in runs]
    costs = [1.0, 1.0, 1.0, 5.0, 5.0]
    assert plan_groups(configs, "auto", 2, costs) == [[0], [1, 2], [3], [4]]
    assert plan_groups(configs, "auto", 2) == [[0, 1, 2], [3, 4]]
    assert plan_groups(configs, 8, 2, costs) == [[0, 1, 2], [3, 4]]
    jobs = [Job(run_id=r.run_id, run_dir=str(tmp_path / r.run_id), config=c, jobs_dir=str(tmp_path), cost=k)
            for r, c, k in zip(runs, configs, costs)]
    runner = LocalRunner(RunnerSpec(workers=2, threads=1))
    ids = [r.run_id for r in runs]
    balanced = runner._groups(jobs, balance=True)
    assert [[j.run_id for j in g] for g in balanced] == [[ids[0]], ids[1:3], [ids[3]], [ids[4]]]
    assert [[j.run_id for j in g] for g in runner._groups(jobs)] == [ids[:3], ids[3:]]


def test_study_plan_balances_the_sweep_as_the_runner_does(study_data_dir: Path) -> None:
    """`study plan`'s groups follow the runner's: the sweep, which starts on idle workers,
    balanced by the runs' estimates (the costs of the test above), streamed or by rounds."""
    from types import SimpleNamespace

    from sanlab.study.groups import plan_table_rows

    spec = _spec(study_data_dir, "auto")
    san, iso = build_arms(spec)
    runs = [*sweep_runs(spec, san, "muon", [0.5, 1, 2], str(study_data_dir)),
            *sweep_runs(spec, iso, "muon", [1, 2], str(study_data_dir))]
    secs = dict(zip([r.run_id for r in runs], [1.0, 1.0, 1.0, 5.0, 5.0]))
    for stream in (True, False):
        plan = SimpleNamespace(runs=runs, run_seconds=lambda r, start=True: secs[r.run_id] + (0.5 if start else 0.0),
                               start_seconds=lambda r: 0.5, stream=stream)
        rows = plan_table_rows(plan, "auto", 2)
        assert [r[1] for r in rows] == [[runs[1].run_id, runs[2].run_id]]  # the SAN pair; the rest solo
        assert rows[0][2] == pytest.approx(0.5 + 2.0 / 1.05)


def test_the_runner_balances_the_batch_it_starts_with_not_what_joins_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`LocalRunner.run` balances its first batch, which starts on idle workers; the jobs
    `more` adds (a cell's next sweep points, its final runs) join while others run and are
    grouped as they come."""
    from sanlab.study.runner import Job, LocalRunner
    from sanlab.study.spec import RunnerSpec
    from test_study_warm import _jobs

    a, b, c, d = _jobs(tmp_path, ["a", "b", "c", "d"])
    extra = [d]
    runner = LocalRunner(RunnerSpec(workers=2, threads=1, members=1))
    seen: list[tuple[list[str], bool]] = []
    real = runner._groups

    def spy(jobs: list[Job], balance: bool = False) -> list[list[Job]]:
        seen.append(([j.run_id for j in jobs], balance))
        return real(jobs, balance)

    def more() -> list[Job]:
        out, extra[:] = list(extra), []
        return out

    monkeypatch.setattr(runner, "_groups", spy)
    try:
        runner.run([a, b, c], lambda job, outcome: None, more=more)
    finally:
        runner.close()
    assert [x for x in seen if x[0]] == [(["a", "b", "c"], True), (["d"], False)]


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


def test_a_runner_members_override_that_fits_neither_form_names_both(study_data_dir: Path) -> None:
    """On the command line the value is parsed against `StrictInt | "auto"` before the spec
    validates it: the one line names both forms, not pydantic's `runner.members.int` tag."""
    raw = tomllib.loads(SPEC.format(data=study_data_dir))
    for bad in ("abc", "AUTO", "1.5", "true"):
        with pytest.raises(ConfigError) as e:
            apply_overrides(StudySpec, raw, [f"runner.members={bad}"])
        assert str(e.value) == f"override runner.members={bad}: Input should be a valid integer or 'auto'"
    for good, want in (("auto", "auto"), ('"auto"', "auto"), ("3", 3)):
        assert apply_overrides(StudySpec, raw, [f"runner.members={good}"]).runner.members == want
    with pytest.raises(ConfigError, match=r"^override runner.workers=abc: Input should be a valid integer, unable"):
        apply_overrides(StudySpec, raw, ["runner.workers=abc"])  # (a plain field keeps pydantic's own line)


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
    monkeypatch.setattr(groups, "plan_groups", lambda cfgs, setting, workers, costs=None: (
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


def test_a_gpu_runner_never_groups_and_a_cpu_runner_does(tmp_path: Path) -> None:
    """Members are a CPU runner's: a GPU worker owns its GPUs one run at a time (a group would
    train on a slot it never took), whatever `runner.members` says."""
    from sanlab.config import load_config
    from sanlab.study.runner import Job, LocalRunner
    from sanlab.study.spec import RunnerSpec

    cfg = json.loads(load_config(None, ["model.d_model=32", "model.n_layers=2", "train.device=cpu",
                                        "train.steps=4"]).model_dump_json())
    jobs = [Job(run_id=n, run_dir=str(tmp_path / n), config=dict(cfg, train=dict(cfg["train"], seed=s)),
                jobs_dir=str(tmp_path / "jobs")) for s, n in enumerate("abc")]
    cpu = LocalRunner(RunnerSpec(workers=1, threads=1, members=4))
    assert [len(g) for g in cpu._groups(jobs)] == [3]
    gpu = LocalRunner(RunnerSpec(workers=1, threads=1, members=4, gpus_per_run=1))
    assert [len(g) for g in gpu._groups(jobs)] == [1, 1, 1]


def test_a_group_starts_by_its_runs_total_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Longest first, a group costing its runs' sum: three runs of 1 (3 together) before a
    run of 2."""
    from sanlab.study.runner import Job, LocalRunner
    from sanlab.study.spec import RunnerSpec

    jobs = [Job(run_id=n, run_dir=str(tmp_path / n), config={}, jobs_dir=str(tmp_path), cost=c)
            for n, c in [("d", 2.0), ("a", 1.0), ("b", 1.0), ("c", 1.0)]]
    runner = LocalRunner(RunnerSpec(workers=1, threads=1))
    monkeypatch.setattr(runner, "_groups", lambda js, balance=False: [[j for j in js if j.run_id != "d"],
                                                                      [j for j in js if j.run_id == "d"]])
    monkeypatch.setattr(runner, "_start_warm", lambda: None)
    order: list[list[str]] = []
    monkeypatch.setattr(runner, "_one", lambda j: order.append([j.run_id]) or {"status": "completed"})
    monkeypatch.setattr(runner, "_group", lambda g: order.append([j.run_id for j in g])
                        or [{"status": "completed"}] * len(g))
    runner.run(jobs, lambda job, outcome: None)
    assert order == [["a", "b", "c"], ["d"]]
