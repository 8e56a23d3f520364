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
from sanlab.study.plan import StudyArm, build_arms, noise_arm, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore
from sanlab.study.table import Gap, gap_table, gaps, locks, sweep_rows, sweep_table, throughput, verdict


def table_json(study_dir: str | Path) -> dict[str, Any]:
    """`sanlab study table STUDY_DIR --json`, as data (see `tables`)."""
    spec = load_saved_spec(study_dir)
    return tables(spec, build_arms(spec), ResultStore(study_dir).runs())


def _arm(a: StudyArm) -> dict[str, Any]:
    m = a.model
    return {"name": a.name, "role": a.role, "kind": a.kind, "label": a.label,
            "params_total": a.params_total, "params_non_embedding": a.params_non_embedding,
            "flops_per_token": a.flops_per_token, "mismatch": a.mismatch,
            "mixer": m.mixer, "layout": m.layout if isinstance(m.layout, str) else list(m.layout),
            "state_mixer": m.state_mixer, "freeze": sorted((a.train or {}).get("freeze") or [])}


def tables(spec: StudySpec, arms: list[StudyArm], records: Mapping[str, dict]) -> dict[str, Any]:
    """What `study table` shows, as data: the gaps (each with its verdict against the noise
    floor and the run ids of its seed pairs), the noise floor (with its size F,
    `sanlab.study.noise`), the sweep, the arms (with the mixer, layout, state mixer and
    frozen groups that make each one), the locks, the measured throughput and the tables'
    own titles."""
    lock = locks(spec, arms, records, set(records))
    rows, noise_rows = gaps(spec, arms, records, lock)
    floor = noise_rows[0] if noise_rows else None
    by_name = {a.name: a for a in arms}
    ref = arms[0]

    def pairs(g: Gap, seeds: list[int]) -> dict[str, dict[str, str]]:
        arm = by_name.get(g.arm) or noise_arm(spec)
        lr_ref = lock[(ref.name, g.optimizer)]
        lr_arm = lock.get((arm.name, g.optimizer), lr_ref)
        return {str(s): {"reference": run_id(ref, g.optimizer, lr_ref, g.tokens, s),
                         "arm": run_id(arm, g.optimizer, lr_arm, g.tokens, s)} for s in seeds}

    sweep_title, warnings = "", []
    if spec.sweep.enabled:
        table, warnings = sweep_table(spec, arms, records)
        sweep_title = str(table.title)
    return {
        "gaps": [{**g.to_dict(), "verdict": verdict(g, floor), "runs": pairs(g, spec.seeds)} for g in rows],
        "noise_floor": [{**g.to_dict(), "size": noise.floor_size(g.per_seed.values()),
                         "runs": pairs(g, spec.noise_seeds)} for g in noise_rows],
        "sweep": [r.to_dict() for r in sweep_rows(spec, arms, records)],
        "arms": [_arm(a) for a in arms],
        "locks": [{"arm": a, "optimizer": o, "lr": lr} for (a, o), lr in lock.items()],
        "throughput": throughput(records),
        "titles": {"gap": str(gap_table(spec, arms, records, lock).title), "sweep": sweep_title},
        "sweep_warnings": warnings,
    }
