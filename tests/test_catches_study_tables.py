"""Tests that catch planted bugs in the study's sweep decisions, tables, `--json`, run
orchestration and time estimates (each one a mutant in scripts/mutate.py, named in its
docstring): what each definition gives, on records written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sanlab.study.plan import build_arms, data_points, noise_arm, plan_study, round_lr, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.sweep import decide
from sanlab.study.table import gaps, locks, sweep_rows, sweep_table, verdict

SEEDS = [1, 2]


def _spec(**extra: Any) -> StudySpec:
    raw: dict[str, Any] = {
        "name": "audit", "seeds": SEEDS, "optimizers": ["muon"],
        "data": {"dir": "prepared", "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "sweep": {"enabled": False}, "final": {"tokens": [2000]},
    }
    for k, v in extra.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return StudySpec.model_validate(raw)


def _done(loss: float, status: str = "completed") -> dict[str, Any]:
    return {"status": status, "final": {"val_loss": loss}}


def _final_records(spec: StudySpec, losses: dict[str, dict[int, tuple[float, str] | float]],
                   tokens: int | None = None, data: str = "") -> dict[str, dict]:
    """Run records of the final / noise runs at the base-LR locks (sweep off)."""
    arms = build_arms(spec)
    by_name = {a.name: a for a in [*arms, noise_arm(spec)]}
    lock = locks(spec, arms, {}, set())
    out = {}
    for name, per_seed in losses.items():
        arm = by_name[name]
        lr = lock.get((name, "muon"), lock[(arms[0].name, "muon")])
        for seed, v in per_seed.items():
            loss, status = v if isinstance(v, tuple) else (v, "completed")
            out[run_id(arm, "muon", lr, tokens or spec.final.tokens[0], seed, data)] = _done(loss, status)
    return out


# --------------------------------------------------------------------------- sweep.py


def test_a_tie_between_sweep_points_locks_the_smaller_lr() -> None:
    """sweep-tie-larger: ties go to the smaller LR (the safer lock), so an interior tie is done."""
    d = decide([0.5, 1.0, 2.0], {0.5: 2.1, 1.0: 2.0, 2.0: 2.0}, extend=True, max_extensions=2)
    assert d.best == 1.0 and d.done and not d.at_edge and d.pending == ()


def test_a_one_point_grid_never_extends_past_its_extension_limit() -> None:
    """sweep-both-edges-overbudget: at both edges with one extension left, one point is added."""
    d = decide([1.0], {1.0: 2.0}, extend=True, max_extensions=1)
    assert d.pending == (0.5,)
    results: dict[float, float | None] = {}
    for _ in range(10):  # a flat curve: the best stays at both edges
        d = decide([1.0], results, extend=True, max_extensions=1)
        if d.done:
            break
        results.update({m: 2.0 for m in d.pending})
    assert len(results) - 1 <= 1 and d.extensions <= 1


# --------------------------------------------------------------------------- table.py


def test_gap_percent_is_of_the_reference_loss() -> None:
    """gap-percent-of-arm: Δ % = 100 · mean Δ / reference loss."""
    spec = _spec(noise={"enabled": False})
    arms = build_arms(spec)
    ref, arm = arms[0].name, arms[1].name
    records = _final_records(spec, {ref: {1: 3.0, 2: 3.0}, arm: {1: 2.7, 2: 2.7}})
    (g,), _ = gaps(spec, arms, records, locks(spec, arms, {}, set()))
    assert g.mean == pytest.approx(-0.3)
    assert g.percent == pytest.approx(-10.0)  # of the arm's loss 2.7 it would be -11.1


def test_the_noise_floor_is_read_at_noise_seeds() -> None:
    """noise-floor-at-final-seeds: the floor pair's seeds are noise.seeds, not seeds."""
    spec = _spec(noise={"seeds": [7, 8]})
    arms = build_arms(spec)
    ref, other = arms[0].name, noise_arm(spec).name
    records = _final_records(spec, {ref: {7: 3.0, 8: 3.2}, other: {7: 3.01, 8: 3.18}}, tokens=spec.noise_tokens)
    _, (floor,) = gaps(spec, arms, records, locks(spec, arms, {}, set()))
    assert floor.per_seed == pytest.approx({7: 0.01, 8: -0.02})


def test_a_diverged_run_is_no_seed_of_a_gap() -> None:
    """gap-counts-diverged: a diverged run keeps its last evaluation's val_loss in `final`
    (trainer), but it is no result of its seed pair."""
    spec = _spec(noise={"enabled": False})
    arms = build_arms(spec)
    ref, arm = arms[0].name, arms[1].name
    records = _final_records(spec, {ref: {1: 3.0, 2: 3.1}, arm: {1: 2.9, 2: (2.0, "diverged")}})
    (g,), _ = gaps(spec, arms, records, locks(spec, arms, {}, set()))
    assert g.per_seed == pytest.approx({1: -0.1})
    assert g.arm_loss == pytest.approx(2.9)


def _sweep_spec(**sweep: Any) -> StudySpec:
    return _spec(sweep={"enabled": True, "tokens": 1000, "multipliers": [0.5, 1.0, 2.0], **sweep})


def _sweep_records(spec: StudySpec, losses: dict[float, float]) -> dict[str, dict]:
    arm = build_arms(spec)[0]
    base = arm.base_lr_for(spec, "muon")
    out = {}
    for m, loss in losses.items():
        rid = run_id(arm, "muon", round_lr(base * m), spec.sweep.tokens, spec.sweep_seed)
        out[rid] = {"type": "run", "run_id": rid, "arm": arm.name, "optimizer": "muon", "phases": ["sweep"],
                    "multiplier": m, "tokens": spec.sweep.tokens, "seed": spec.sweep_seed, **_done(loss)}
    return out


def test_a_sweep_row_still_extending_is_not_at_an_edge_and_has_no_warning() -> None:
    """sweep-row-edge-mid-sweep: a cell whose best is at the edge but whose extension is
    still pending has no lock, so no edge flag and no edge warning (the warning would
    format its missing lock)."""
    spec = _sweep_spec(extend=True, max_extensions=2)
    arms = build_arms(spec)
    records = _sweep_records(spec, {0.5: 3.2, 1.0: 3.1, 2.0: 3.0})
    row = sweep_rows(spec, arms, records)[0]  # (the reference's cell; its partner's has no points yet)
    assert row.best == 2.0 and not row.done and row.lock is None
    assert row.at_edge is False
    table, warnings = sweep_table(spec, arms, records)
    assert warnings == []


def test_the_sweep_table_bolds_the_best_multipliers_loss() -> None:
    """sweep-bold-wrong-column: the bold cell is the best multiplier's loss."""
    spec = _sweep_spec(extend=False)
    arms = build_arms(spec)
    records = _sweep_records(spec, {0.5: 3.2, 1.0: 3.05, 2.0: 3.1})
    table, _ = sweep_table(spec, arms, records)
    assert table.bold == {(0, 3)}  # arm, base LR, 0.5×, [1×]
    assert table.rows[0][3] == "3.0500"


# --------------------------------------------------------------------------- results.py


def test_json_names_the_noise_pairs_runs_at_noise_seeds() -> None:
    """json-noise-runs-final-seeds: `table --json`'s noise_floor runs are the noise seeds' runs."""
    from sanlab.study.results import tables

    spec = _spec(noise={"seeds": [7, 8]})
    arms = build_arms(spec)
    ref, other = arms[0].name, noise_arm(spec).name
    records = _final_records(spec, {ref: {7: 3.0, 8: 3.2}, other: {7: 3.01, 8: 3.18}}, tokens=spec.noise_tokens)
    out = tables(spec, arms, records, data_points(spec, None))
    (floor,) = out["noise_floor"]
    assert sorted(floor["runs"]) == ["7", "8"]
    for pair in floor["runs"].values():
        assert pair["reference"] in records and pair["arm"] in records


def test_json_verdict_on_a_data_axis_reads_each_values_own_floor() -> None:
    """json-verdict-first-floor: each axis value's gap is read against that value's floor."""
    from sanlab.study.results import tables
    from sanlab.study.table import all_gaps, floors_by_point

    spec = _spec(data={"dir": None, "corpus": "synth", "tokens": 3000, "axis": {"synth.facts": [64, 128]}})
    arms = build_arms(spec)
    points = data_points(spec, "/nonexistent-study")
    ref, arm, other = arms[0].name, arms[1].name, noise_arm(spec).name
    records: dict[str, dict] = {}
    for p, shift in zip(points, (0.5, 0.001)):  # the first value's floor is 500× the second's
        records.update(_final_records(spec, {ref: {1: 3.0, 2: 3.0}, arm: {1: 2.9, 2: 2.9}}, data=p.slug))
        records.update(_final_records(spec, {ref: {1: 3.0, 2: 3.0}, other: {1: 3.0 + shift, 2: 3.0 + shift}},
                                      tokens=spec.noise_tokens, data=p.slug))
    out = tables(spec, arms, records, points)
    rows, noise_rows = all_gaps(spec, arms, records, points)
    floors = floors_by_point(noise_rows)
    got = {g["data"]: g["verdict"] for g in out["gaps"]}
    assert got == {g.data: verdict(g, floors[g.data]) for g in rows}
    assert got[points[0].slug] == "within noise" and got[points[1].slug].startswith(f"{arm} ahead")


# --------------------------------------------------------------------------- orchestrate.py


def test_a_new_first_seed_is_refused_as_a_moved_sweep_seed() -> None:
    """sweep-seed-unresolved: the sweep seed defaults to seeds[0]; prepending a seed moves
    the sweep (every sweep point would be another run), which --extend must refuse."""
    from sanlab.study.orchestrate import spec_changes

    old = _spec(sweep={"enabled": True})
    new = _spec(sweep={"enabled": True}, seeds=[0, 1, 2])
    changed, grown = spec_changes(old, new)
    assert any(c.startswith("sweep.seed (1 -> 0") for c in changed), changed


class _RecordingRunner:
    def __init__(self) -> None:
        self.jobs: list[str] = []

    def run(self, jobs: Any, on_done: Any) -> None:
        self.jobs += [j.run_id for j in jobs]


def test_a_diverged_run_is_a_result_and_is_not_run_again(tmp_path: Path) -> None:
    """diverged-retrained: `_execute` (the rounds runner's batches) skips finished runs,
    diverged ones included (FINAL_STATUSES)."""
    from sanlab.study.orchestrate import Study
    from sanlab.study.plan import final_runs

    spec = _spec(noise={"enabled": False})
    runner = _RecordingRunner()
    study = Study(spec, tmp_path, runner=runner)  # type: ignore[arg-type]
    study.arms = build_arms(spec)
    runs = final_runs(spec, study.arms, locks(spec, study.arms, {}, set()), str(tmp_path / "data"))
    for r, status in zip(runs, ["diverged", "completed", "failed", "diverged"]):
        study.store.append({"type": "run", "run_id": r.run_id, "status": status, "arm": r.arm,
                            "optimizer": r.optimizer, "phases": ["final"], "final": {"val_loss": 3.0}})
    study._execute(runs, "final")
    assert runner.jobs == [runs[2].run_id]


def test_the_data_record_counts_the_train_splits_tokens(study_data_dir: Path, tmp_path: Path) -> None:
    """data-record-val-tokens: the store's data record holds the train split's token count."""
    from sanlab.data.shards import load_manifest
    from sanlab.study.orchestrate import data_record
    from sanlab.study.spec import DataPoint

    splits = load_manifest(study_data_dir, verify=False)["splits"]
    assert splits["train"]["tokens"] != splits["val"]["tokens"]
    rec = data_record(DataPoint(None, None, "", str(study_data_dir)), study_data_dir, tmp_path)
    assert rec["train_tokens"] == splits["train"]["tokens"]


# --------------------------------------------------------------------------- plan.py


def test_an_untimed_run_is_the_reference_throughput_scaled_by_flops() -> None:
    """untimed-flops-ratio-inverted: seconds = tokens / (tokens_per_s · ref FLOPs / run FLOPs)."""
    spec = _spec(runner={"tokens_per_s": 1000.0}, noise={"enabled": False})
    plan = plan_study(spec)
    ref = plan.arms[0]
    run = next(r for r in plan.runs if r.arm == plan.arms[1].name)
    assert run.flops_per_token != ref.flops_per_token
    assert plan.run_seconds(run) == pytest.approx(run.tokens * run.flops_per_token / (1000.0 * ref.flops_per_token))


def test_a_slurm_plan_runs_array_parallelism_at_a_time() -> None:
    """slurm-parallel-from-workers: a SLURM study's estimate packs the runs on
    runner.slurm.array_parallelism, not on the local runner's workers."""
    spec = _spec(runner={"kind": "slurm", "workers": 1, "slurm": {"array_parallelism": 3}})
    plan = plan_study(spec)
    assert plan.workers == 3 and not plan.stream


def test_a_sweep_point_shared_with_a_final_run_keeps_its_multiplier() -> None:
    """merge-loses-multiplier: the ×1 sweep point at a final budget and seed is one run with
    both phases and its multiplier."""
    spec = _spec(sweep={"enabled": True, "tokens": 2000, "multipliers": [0.5, 1.0, 2.0]}, noise={"enabled": False})
    plan = plan_study(spec)
    shared = [r for r in plan.runs if "sweep" in r.phases and "final" in r.phases]
    assert len(shared) == 2  # (one a cell: the reference's and its partner's)
    assert [r.multiplier for r in shared] == [1.0, 1.0]
    assert [plan.to_dict()["runs"][plan.runs.index(r)]["multiplier"] for r in shared] == [1.0, 1.0]
