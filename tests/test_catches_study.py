"""The noise-floor pair is paired seed by seed, in the plan and in the table.

A check of the mean alone cannot see an unpaired floor: shifting one half of the pair
by one seed (cyclically) permutes the differences and leaves their mean unchanged. So
the losses here differ from seed to seed and every seed's Δ is checked on its own.
"""

from __future__ import annotations

import pytest

from sanlab.study.plan import build_arms, final_runs, noise_arm, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.table import gaps, locks

SEEDS = [1, 2, 3, 4]
# Validation loss per seed of the two halves of the pair (zcrms reference, rms partner).
ZCRMS = {1: 3.10, 2: 3.50, 3: 3.20, 4: 3.90}
RMS = {1: 3.13, 2: 3.48, 3: 3.27, 4: 3.91}


def _spec() -> StudySpec:
    return StudySpec.model_validate({
        "name": "pairs", "seeds": SEEDS, "optimizers": ["muon"],
        "data": {"dir": "prepared", "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "sweep": {"enabled": False}, "final": {"tokens": [2000]},
    })


def test_the_planned_noise_pair_shares_every_seed_and_setting() -> None:
    spec = _spec()
    arms = build_arms(spec)
    runs = [r for r in final_runs(spec, arms, locks(spec, arms, {}, set()), "prepared") if "noise" in r.phases]
    by_arm: dict[str, dict[int, object]] = {}
    for r in runs:
        by_arm.setdefault(r.arm, {})[r.seed] = r
    ref, other = arms[0].name, noise_arm(spec).name
    assert set(by_arm) == {ref, other}
    assert sorted(by_arm[ref]) == sorted(by_arm[other]) == SEEDS
    for seed in SEEDS:
        a, b = by_arm[ref][seed], by_arm[other][seed]
        assert a.config.train.seed == b.config.train.seed == seed  # type: ignore[attr-defined]
        assert {a.config.model.norm, b.config.model.norm} == {"zcrms", "rms"}  # type: ignore[attr-defined]
        # Same run but for the norm: same data, optimizer, LR, budget, seed.
        da, db = a.config.model_dump(), b.config.model_dump()  # type: ignore[attr-defined]
        da["model"].pop("norm"), db["model"].pop("norm")
        assert da == db


def test_the_noise_floor_is_paired_seed_by_seed() -> None:
    spec = _spec()
    arms = build_arms(spec)
    lock = locks(spec, arms, {}, set())
    ref, other = arms[0], noise_arm(spec)
    assert ref.model.norm == "zcrms" and other.model.norm == "rms"
    lr = lock[(ref.name, "muon")]
    records = {}
    for arm, losses in ((ref, ZCRMS), (other, RMS)):
        for seed, loss in losses.items():
            records[run_id(arm, "muon", lr, spec.noise_tokens, seed)] = {
                "status": "completed", "final": {"val_loss": loss}}
    _, noise = gaps(spec, arms, records, lock)
    assert len(noise) == 1
    floor = noise[0]
    assert sorted(floor.per_seed) == SEEDS
    for seed in SEEDS:
        assert floor.per_seed[seed] == pytest.approx(RMS[seed] - ZCRMS[seed], abs=1e-12), seed
    assert floor.san_loss == pytest.approx(sum(ZCRMS.values()) / 4)
    assert floor.other_loss == pytest.approx(sum(RMS.values()) / 4)
