"""A study dir's results as data: what `sanlab study table --json` prints, and what the
report (`sanlab.report`) and the records (`sanlab.records`) render. They read it from
here; nothing downstream recomputes a gap, a lock or a noise verdict.

Computed from the saved spec and the results store alone (so also while the study is
still running). Building the arms counts their parameters with the model's accounting,
which imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from sanlab.study import noise
from sanlab.study.orchestrate import load_saved_spec
from sanlab.study.plan import DataPoint, StudyArm, build_arms, data_points, noise_arm, plan_study, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore, live_status
from sanlab.study.table import (
    Gap,
    all_gaps,
    axis_rows,
    data_rows,
    floors_by_point,
    gap_table,
    locks,
    locks_by_point,
    sweep_note,
    sweep_floors,
    sweep_rows,
    sweep_table,
    swept_points,
    throughput,
    unresolved_lock,
    verdict,
)


def run_rows(spec: StudySpec, study_dir: str | Path, records: Mapping[str, dict]) -> list[dict[str, Any]]:
    """Every run of the study's plan with its status: the store's, else what its run dir's
    meta.json says (`pending` without one). `study status` lists them and the report
    counts them, so the two always agree."""
    arms_plan = plan_study(spec, study_dir, records)
    plan = plan_study(spec, study_dir, records, point_locks=locks_by_point(
        spec, arms_plan.arms, records, set(records), data_points(spec, study_dir)))
    rows = []
    for r in plan.runs:
        rec = records.get(r.run_id)
        rows.append({"run_id": r.run_id, "phase": r.phase, "in_store": rec is not None,
                     "status": rec["status"] if rec else live_status(Path(study_dir) / "runs" / r.run_id),
                     "val_loss": ((rec or {}).get("final") or {}).get("val_loss"),
                     "wall_s": (rec or {}).get("wall_s"), "note": r.note})
    return rows


def table_json(study_dir: str | Path) -> dict[str, Any]:
    """`sanlab study table STUDY_DIR --json`, as data (see `tables`)."""
    spec = load_saved_spec(study_dir)
    store = ResultStore(study_dir)
    return tables(spec, build_arms(spec), store.runs(), data_points(spec, study_dir), store.data())


def _arm(a: StudyArm) -> dict[str, Any]:
    m = a.model
    return {"name": a.name, "role": a.role, "kind": a.kind, "label": a.label,
            "params_total": a.params_total, "params_non_embedding": a.params_non_embedding,
            "flops_per_token": a.flops_per_token, "mismatch": a.mismatch,
            "mixer": m.mixer, "layout": m.layout if isinstance(m.layout, str) else list(m.layout),
            "state_mixer": m.state_mixer, "freeze": sorted((a.train or {}).get("freeze") or [])}


def tables(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict], points: list[DataPoint],
           data_info: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """What `study table` shows, as data: the gaps (each with its verdict against the noise
    floor and the run ids of its seed pairs), the noise floor (with its size F,
    `sanlab.study.noise`), the sweep, the arms (with the mixer, layout, state mixer and
    frozen groups that make each one), the locks, the measured throughput and the tables'
    own titles; the data points (`data`, one without a data axis) with the world's facts
    and bits per parameter of each arm (`data_rows`, from the store's `data` records) and,
    on a data axis, Δ per arm against it (`axis`). Every gap, noise pair, sweep row and
    lock names its data point (`data`, its slug; "" without an axis)."""
    lock = locks(spec, arms, records, set(records))
    by_point = locks_by_point(spec, arms, records, set(records), points)
    rows, noise_rows = all_gaps(spec, arms, records, points)
    floors = floors_by_point(noise_rows)
    by_name = {a.name: a for a in arms}
    ref = arms[0]

    def pairs(g: Gap, seeds: list[int]) -> dict[str, dict[str, str]]:
        arm = by_name.get(g.arm) or noise_arm(spec)
        at = by_point[g.data]
        lr_ref = at[(ref.name, g.optimizer)]
        lr_arm = at.get((arm.name, g.optimizer), lr_ref)
        return {str(s): {"reference": run_id(ref, g.optimizer, lr_ref, g.tokens, s, g.data),
                         "arm": run_id(arm, g.optimizer, lr_arm, g.tokens, s, g.data)} for s in seeds}

    sweep_title, warnings, sweep = "", [], []
    if spec.sweep.enabled:
        sizes = sweep_floors(spec, arms, records, points)
        for p in swept_points(spec, points):
            table, w = sweep_table(spec, arms, records, p if p.slug else None, sizes.get(p.slug))
            sweep_title = sweep_title or str(table.title)
            warnings += w
            sweep += [{**r.to_dict(), "within_floor": unresolved_lock(r, sizes.get(p.slug))}
                      for r in sweep_rows(spec, arms, records, p.slug)]
    else:
        sweep = [r.to_dict() for r in sweep_rows(spec, arms, records)]
    axis = spec.data.axis_key
    out = {
        "gaps": [{**g.to_dict(), "verdict": verdict(g, floors.get(g.data)), "runs": pairs(g, spec.seeds)}
                 for g in rows],
        "noise_floor": [{**g.to_dict(), "size": noise.floor_size(g.per_seed.values()),
                         "runs": pairs(g, spec.noise_seeds)} for g in noise_rows],
        "sweep": sweep,
        "arms": [_arm(a) for a in arms],
        "locks": ([{"arm": a, "optimizer": o, "lr": lr} for (a, o), lr in lock.items()] if not axis else
                  [{"arm": a, "optimizer": o, "lr": lr, "data": slug}
                   for slug, at in by_point.items() for (a, o), lr in at.items()]),
        "throughput": throughput(records),
        "titles": {"gap": str(gap_table(spec, arms, records, lock, points).title), "sweep": sweep_title},
        "sweep_warnings": warnings,
        "data": {"key": axis, "values": list(spec.data.axis_values), "sweep": sweep_note(spec) if axis else None,
                 "lock_at": spec.sweep.lock_at,
                 "points": [{**{k: v for k, v in p.to_dict().items() if k != "dir"},
                             "info": {k: v for k, v in (data_info or {}).get(p.slug, {}).items()
                                      if k not in ("type", "time", "dir")} or None}
                            for p in points],
                 "per_arm": data_rows(spec, arms, data_info or {}, points)},
    }
    if axis:
        out["axis"] = axis_rows(spec, arms, records, points)
    return out
