"""`study plan`'s time estimate from each arm's measured training step (sanlab.study.speed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sanlab.study import speed
from sanlab.study.plan import plan_study
from sanlab.study.spec import StudySpec
from sanlab.study.warm import WARM_START_S


def tiny_spec(data_dir: Path, **extra: object) -> StudySpec:
    raw: dict = {
        "name": "speed", "seeds": [1], "optimizers": ["muon"],
        "data": {"dir": str(data_dir), "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "train": {"batch_rows": 4, "eval_every": 0, "eval_rows": 4, "precision": "fp32"},
        "sweep": {"tokens": 1280, "multipliers": [1.0, 2.0]},
        "final": {"tokens": [2560]},
        "noise": {"enabled": False},
        "runner": {"workers": 1, "threads": 1},
    }
    raw.update(extra)
    return StudySpec.model_validate(raw)


def test_real_timing_is_cached_per_shape(study_data_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_study(tiny_spec(study_data_dir))
    speeds, notes = speed.arm_speeds(plan.runs, 1, tmp_path, steps=1)
    assert set(speeds) == {r.run_id for r in plan.runs} and not notes
    for s in speeds.values():
        assert all(s[k] > 0 for k in ("step_s", "eval_s", "ready_s", "setup_s", "save_s")), s
    cache = json.loads((tmp_path / speed.SPEED_FILE).read_text())
    assert len(cache["shapes"]) == 2  # two shapes (SAN, iso-param partner), each timed once

    def no_measuring(*a: object, **k: object) -> dict:
        raise AssertionError("timed again although the study dir caches every shape")

    monkeypatch.setattr(speed, "measure", no_measuring)
    again, _ = speed.arm_speeds(plan.runs, 1, tmp_path)
    assert again == speeds


def test_key_follows_what_changes_the_step_cost(study_data_dir: Path) -> None:
    run = plan_study(tiny_spec(study_data_dir)).runs[0]
    cfg = json.loads(run.config.model_dump_json())
    key = speed.shape_key(cfg, 1)
    assert speed.shape_key({**cfg, "optim": {**cfg["optim"], "lr": 9.0}}, 1) == key  # LR: same cost
    assert speed.shape_key({**cfg, "train": {**cfg["train"], "seed": 7, "tokens": 1}}, 1) == key
    assert speed.shape_key(cfg, 2) != key
    assert speed.shape_key(cfg, 1, side_by_side=2) != key  # runs sharing the machine
    assert speed.shape_key({**cfg, "model": {**cfg["model"], "n_layers": 9}}, 1) != key
    assert speed.shape_key({**cfg, "train": {**cfg["train"], "batch_rows": 8}}, 1) != key


def test_estimate_uses_the_measured_step(study_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny_spec(study_data_dir, train={"batch_rows": 4, "eval_every": 5, "eval_rows": 4})
    plan = plan_study(spec)

    def fake(configs: dict, threads: int | None, **_: object) -> dict:
        return {"ready_s": 2.0, "shapes": {k: {"step_s": 0.5, "eval_s": 0.25, "setup_s": 0.1, "save_s": 0.125,
                                               "tokens_per_s": 256} for k in configs}}

    monkeypatch.setattr(speed, "measure", fake)
    plan.speeds, _ = speed.arm_speeds(plan.runs, 1, None)
    final = next(r for r in plan.runs if r.tokens == 2560)
    steps = 2560 // (4 * 32)  # 20 steps
    evals = 1 + 4  # step 0, then every 5 steps (the last one among them)
    saves = 1 + 4  # step 0, then milestones 25/50/75/100% at steps 5, 10, 15, 20
    body = 0.1 + steps * 0.5 + evals * 0.25 + saves * 0.125
    # the local runner forks each run from a warm process: the imports (ready_s) once a worker
    assert plan.warm and plan.startup_seconds == 2.0
    assert plan.run_seconds(final) == pytest.approx(WARM_START_S + body)
    assert plan.run_seconds(final, start=False) == pytest.approx(body)
    # a last step off the eval grid is evaluated too; rolling checkpoints add saves
    odd = final.config.model_copy(update={"train": final.config.train.model_copy(
        update={"eval_every": 6, "checkpoint_every": 8})})
    final.config = odd
    evals, saves = 1 + 4, 1 + 6  # 6, 12, 18, 20; milestones 5/10/15/20 and 8, 16
    body = 0.1 + steps * 0.5 + evals * 0.25 + saves * 0.125
    assert plan.run_seconds(final) == pytest.approx(WARM_START_S + body)
    # one worker: the imports once, then every run one after another
    assert plan.total_seconds == pytest.approx(2.0 + sum(plan.run_seconds(r) for r in plan.runs))
    # a fresh process for each run (SLURM, SANLAB_WARM_WORKERS=0): each run pays the imports
    plan.warm = False
    assert plan.startup_seconds == 0.0 and plan.run_seconds(final) == pytest.approx(2.0 + body)
    assert plan.total_seconds == pytest.approx(sum(plan.run_seconds(r) for r in plan.runs))


def test_the_plan_knows_when_runs_fork_from_warm_processes(study_data_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan_study(tiny_spec(study_data_dir)).warm
    assert not plan_study(tiny_spec(study_data_dir, runner={"kind": "slurm"})).warm
    assert not plan_study(tiny_spec(study_data_dir, runner={"gpus_per_run": 2})).warm
    monkeypatch.setenv("SANLAB_WARM_WORKERS", "0")
    assert not plan_study(tiny_spec(study_data_dir)).warm


def test_estimate_follows_how_study_run_schedules(study_data_dir: Path) -> None:
    """Two workers: the local runner streams (a cell's final runs once its sweep points have
    finished, `plan.stream_makespan`); the SLURM runner's sweep points are one batch and the
    final runs another, each as long as its busiest worker (longest run first); boundary
    extension can add up to `max_extensions` rounds of one more point per sweep cell."""
    spec = tiny_spec(study_data_dir, runner={"workers": 2, "threads": 1},
                     sweep={"tokens": 1280, "multipliers": [0.5, 1.0, 2.0], "max_extensions": 3})
    plan = plan_study(spec)
    cost = {"san": 3.0, "iso_param": 1.0}
    plan.run_seconds = lambda r: cost[r.arm] * (2 if r.tokens == 2560 else 1)  # type: ignore[method-assign]
    sweep = sorted(plan.run_seconds(r) for r in plan.runs if "sweep" in r.phases)
    finals = sorted(plan.run_seconds(r) for r in plan.runs if "sweep" not in r.phases)
    assert sweep == [1.0] * 3 + [3.0] * 3 and finals == [2.0, 6.0]
    # streamed: the SAN's points 0→3, 0→3, 3→6, iso-param's 3→4, 4→5, 5→6; both cells end at
    # 6, then the finals 6→12 and 6→8
    assert plan.stream and plan.total_seconds == pytest.approx(12.0)
    # by batches (SLURM), LPT on two workers: sweep {3, 3} vs {3, 1, 1, 1} -> 6; finals {6} vs {2} -> 6
    plan.stream = False
    assert plan.total_seconds == pytest.approx(12.0)
    # a cell whose sweep ends early: iso-param's points twice as long (2 s) make its sweep end
    # at 6 with the SAN's by batches, but streamed the SAN's final run (6 s) starts when its own
    # last point ends
    cost["iso_param"] = 2.0
    plan.stream = True
    streamed = plan.total_seconds
    plan.stream = False
    assert streamed < plan.total_seconds
    assert plan.extension_seconds == pytest.approx(3 * 3.0)  # san's and iso_param's points side by side
    assert plan.to_dict()["est_extension_seconds"] == pytest.approx(9.0)
    off = plan_study(tiny_spec(study_data_dir, sweep={"tokens": 1280, "multipliers": [1.0], "extend": False}))
    assert off.extension_seconds == 0.0


def test_timing_runs_side_by_side_as_the_workers_will(study_data_dir: Path) -> None:
    """`side_by_side` measuring processes, started one after another and timed at once;
    each figure is their mean."""
    plan = plan_study(tiny_spec(study_data_dir))
    cfg = json.loads(plan.runs[0].config.model_dump_json())
    got = speed.measure({"k": cfg}, 1, steps=1, side_by_side=2)
    assert got["processes"] == 2 and got["ready_s"] > 0
    assert set(got["shapes"]["k"]) == {"step_s", "eval_s", "setup_s", "save_s", "tokens_per_s"}
    with pytest.raises(RuntimeError, match="timing the arms failed"):
        speed.measure({"k": {**cfg, "model": {**cfg["model"], "n_layers": "many"}}}, 1, steps=1, side_by_side=2)


def test_a_measuring_process_gone_before_go_is_a_timing_error_not_a_broken_pipe(
        study_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the side-by-side timing had: a measuring process that failed (no ready
    line) is alive when asked and gone when `go` is written to it. Here it is always gone
    by then, and asking always answers "alive" (what the instant before the exit says)."""

    class GoneBeforeGo(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            proc, stdout = self, self.stdout

            class Out:
                def readline(self) -> str:
                    line = stdout.readline()
                    if not line:
                        proc.wait()  # exited for sure: its end of the pipe is closed
                    return line

                def __getattr__(self, name: str) -> object:
                    return getattr(stdout, name)

            self.stdout = Out()  # type: ignore[assignment]

        def poll(self) -> int | None:
            return None

    monkeypatch.setattr(speed.subprocess, "Popen", GoneBeforeGo)
    plan = plan_study(tiny_spec(study_data_dir))
    cfg = json.loads(plan.runs[0].config.model_dump_json())
    with pytest.raises(RuntimeError, match="timing the arms failed: .*int_parsing"):
        speed.measure({"k": {**cfg, "model": {**cfg["model"], "n_layers": "many"}}}, 1, steps=1, side_by_side=2)


def test_steps_too_large_to_time_fall_back_to_flops(study_data_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_study(tiny_spec(study_data_dir))
    monkeypatch.setattr(speed, "MAX_TIMED_STEP_FLOPS", 1.0)
    speeds, notes = speed.arm_speeds(plan.runs, 1, None)
    assert speeds == {} and "not timed here" in notes[0]
    r = plan.runs[0]
    assert plan.run_seconds(r) == pytest.approx(
        r.tokens / (plan.tokens_per_s * plan.arms[0].flops_per_token / r.flops_per_token))


def test_torn_cache_is_measured_again(tmp_path: Path) -> None:
    (tmp_path / speed.SPEED_FILE).write_text('{"shapes": {"ab')
    assert speed.load_cache(tmp_path) == {}


def test_side_by_side_results_are_averaged() -> None:
    one = {"ready_s": 1.0, "shapes": {"k": {"step_s": 0.2, "eval_s": 0.1}}}
    two = {"ready_s": 3.0, "shapes": {"k": {"step_s": 0.4, "eval_s": 0.3}}}
    got = speed.mean_result([one, two])
    assert got == {"ready_s": 2.0, "shapes": {"k": {"step_s": pytest.approx(0.3), "eval_s": 0.2}}, "processes": 2}
