"""The noise-floor pair is paired seed by seed, in the plan and in the table.

A check of the mean alone cannot see an unpaired floor: shifting one half of the pair
by one seed (cyclically) permutes the differences and leaves their mean unchanged. So
the losses here differ from seed to seed and every seed's Δ is checked on its own.
"""

from __future__ import annotations

import pytest

from sanlab.study.plan import build_arms, data_points, final_runs, noise_arm, run_id
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
    assert floor.ref_loss == pytest.approx(sum(ZCRMS.values()) / 4)
    assert floor.arm_loss == pytest.approx(sum(RMS.values()) / 4)


def _sample_sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def test_the_floors_spread_is_the_sample_standard_deviation_over_seeds() -> None:
    spec = _spec()
    arms = build_arms(spec)
    lock = locks(spec, arms, {}, set())
    lr = lock[(arms[0].name, "muon")]
    records = {}
    for arm, losses in ((arms[0], ZCRMS), (noise_arm(spec), RMS)):
        for seed, loss in losses.items():
            records[run_id(arm, "muon", lr, spec.noise_tokens, seed)] = {"status": "completed",
                                                                      "final": {"val_loss": loss}}
    floor = gaps(spec, arms, records, lock)[1][0]
    assert floor.spread == pytest.approx(_sample_sd([RMS[s] - ZCRMS[s] for s in SEEDS]), rel=1e-9)


def _records(spec: StudySpec, losses: dict[str, dict[int, float]]) -> dict[str, dict]:
    """Completed runs with the given losses per arm name and seed (final and noise budgets)."""
    arms = {a.name: a for a in [*build_arms(spec), noise_arm(spec)]}
    lock = locks(spec, build_arms(spec), {}, set())
    out = {}
    for name, per_seed in losses.items():
        arm = arms[name]
        lr = lock.get((name, "muon"), lock[(build_arms(spec)[0].name, "muon")])
        for seed, loss in per_seed.items():
            for tokens in {*spec.final.tokens, spec.noise_tokens}:
                out[run_id(arm, "muon", lr, tokens, seed)] = {"status": "completed", "final": {"val_loss": loss}}
    return out


def test_delta_is_arm_minus_reference_when_the_reference_is_the_standard_arm() -> None:
    spec = StudySpec.model_validate({
        "name": "ffn-ref", "seeds": [1, 2], "optimizers": ["muon"],
        "data": {"dir": "prepared", "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "ffn": True},
        "matching": {"arms": []}, "arms": [{"name": "san_arm", "model": {"ffn": False}}],
        "sweep": {"enabled": False}, "final": {"tokens": [2000]}, "noise": {"enabled": False},
    })
    arms = build_arms(spec)
    assert arms[0].kind == "ffn" and arms[1].kind == "san"
    records = _records(spec, {arms[0].name: {1: 3.0, 2: 3.1}, "san_arm": {1: 3.2, 2: 3.4}})
    (gap,), _ = gaps(spec, arms, records, locks(spec, arms, {}, set()))
    assert gap.per_seed == pytest.approx({1: 0.2, 2: 0.3})  # Δ = SAN arm − standard reference: > 0
    assert gap.ref_loss == pytest.approx(3.05) and gap.arm_loss == pytest.approx(3.3)


def test_a_gap_inside_the_floors_seed_spread_is_within_noise() -> None:
    from rich.console import Console

    from sanlab.study.table import gap_table
    from sanlab.tables import rich_table

    spec = _spec()
    arms = build_arms(spec)
    ref, partner, other = arms[0].name, arms[1].name, noise_arm(spec).name
    base = {1: 3.0, 2: 3.0, 3: 3.0, 4: 3.0}
    # Floor: mean 0, seed-to-seed spread ~0.026; the partner is 0.02 ahead on every seed.
    records = _records(spec, {ref: base, other: {1: 3.01, 2: 2.99, 3: 3.03, 4: 2.97},
                              partner: {s: v - 0.02 for s, v in base.items()}})
    console = Console(record=True, width=250)
    console.print(rich_table(gap_table(spec, arms, records, locks(spec, arms, {}, set()), data_points(spec, None))))
    row = next(line for line in console.export_text().splitlines() if line.strip("│ ").startswith(partner))
    assert "within noise" in row, row
