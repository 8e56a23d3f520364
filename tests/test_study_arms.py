"""Studies compare arms, not "SAN vs FFN": any reference, explicit arms with their own
train keys and base LRs, and Δ = arm − reference whichever kinds the two are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.config import Config, validate
from sanlab.errors import ConfigError
from sanlab.study.orchestrate import Study
from sanlab.study.plan import arm_tag, build_arms, plan_study, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore
from sanlab.study.table import gaps, locks, sweep_rows

import study_fakes

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def spec_of(data_dir: Path, **extra: object) -> StudySpec:
    raw: dict = {
        "name": "arms", "seeds": [1, 2], "optimizers": ["muon"],
        "data": {"dir": str(data_dir), "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"policy": "nearest", "tolerance": None},
        "sweep": {"tokens": 1000, "max_extensions": 4},
        "final": {"tokens": [2000]},
        "noise": {"enabled": False},
        "runner": {"workers": 1, "threads": 1},
    }
    raw.update(extra)
    return StudySpec.model_validate(raw)


def test_standard_reference_is_matched_and_gaps_are_arm_minus_reference(study_data_dir: Path,
                                                                          tmp_path: Path) -> None:
    """A reference with an FFN gets attention-only partners, and Δ keeps its one
    definition: arm − reference (here SAN − standard), not a flipped "standard − SAN"."""
    spec = spec_of(study_data_dir, model={"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                           "vocab_size": 512, "ffn": True},
                   matching={"arms": ["iso_param"], "policy": "nearest", "tolerance": None})
    arms = build_arms(spec)
    assert [a.name for a in arms] == ["ref", "iso_param"]
    assert arms[0].model.ffn and not arms[1].model.ffn and arms[1].model.n_layers > 2
    console = Console(record=True, width=220)
    assert Study(spec, tmp_path, console=console, train_fn="study_fakes:train").run() == 0
    records = ResultStore(tmp_path).runs()
    lock = locks(spec, arms, records, set(records))
    (g,), _ = gaps(spec, arms, records, lock)
    for seed in (1, 2):
        ref = Config(model=arms[0].model, optim={"lr": lock[("ref", "muon")]}, train={"seed": seed})
        san = Config(model=arms[1].model, optim={"lr": lock[("iso_param", "muon")]}, train={"seed": seed})
        want = study_fakes.expected_loss(san) - study_fakes.expected_loss(ref)
        assert g.per_seed[seed] == pytest.approx(want)
    assert g.reference == "ref" and g.ref_loss is not None and g.arm_loss is not None
    assert g.mean == pytest.approx(g.arm_loss - g.ref_loss)
    text = console.export_text()
    assert "Δ = arm − ref" in text


def test_arm_base_lr_centres_its_own_sweep(study_data_dir: Path, tmp_path: Path) -> None:
    """An explicit arm with its own base LR sweeps around it; the others keep theirs."""
    spec = spec_of(study_data_dir, matching={"arms": []},
                   arms=[{"name": "wide", "model": {"d_model": 64}, "base_lr": {"muon": 0.005}}])
    plan = plan_study(spec)
    sweep = {(r.arm, r.multiplier): r.lr for r in plan.runs if "sweep" in r.phases}
    assert sweep[("wide", 1.0)] == pytest.approx(0.005) and sweep[("wide", 2.0)] == pytest.approx(0.01)
    assert sweep[("san", 1.0)] == pytest.approx(0.02)
    assert Study(spec, tmp_path, console=Console(record=True), train_fn="study_fakes:train").run() == 0
    records = ResultStore(tmp_path).runs()
    rows = {r.arm: r for r in sweep_rows(spec, build_arms(spec), records)}
    assert rows["wide"].base_lr == pytest.approx(0.005)
    # The fake's optimum for an attention-only arm is 0.02 = 4 × 0.005: found by extension.
    assert rows["wide"].lock == pytest.approx(0.02) and sorted(rows["wide"].losses)[-1] >= 4.0


def test_arm_train_keys_reach_its_runs_only(study_data_dir: Path) -> None:
    spec = spec_of(study_data_dir, matching={"arms": []},
                   arms=[{"name": "spiky", "train": {"spike_factor": 3.0}}])
    plan = plan_study(spec)
    by_arm = {r.arm: r.config.train.spike_factor for r in plan.runs}
    assert by_arm == {"san": None, "spiky": 3.0}


@pytest.mark.parametrize("arm, message", [
    ({"name": "a", "train": {"tokens": 100}}, "set per run by the study"),
    ({"name": "a", "train": {"seed": 3}}, "set per run by the study"),
    ({"name": "a", "base_lr": {"muon": 0.0}}, "must be positive"),
    ({"name": "a", "base_lr": {"sgd": 0.1}}, "base_lr"),
    ({"name": "a", "train": {"no_such_key": 1}}, "no_such_key"),
])
def test_bad_arm_is_one_line(study_data_dir: Path, arm: dict, message: str) -> None:
    raw = spec_of(study_data_dir).model_dump(mode="json", exclude_unset=True)
    raw["arms"] = [arm]
    with pytest.raises(ConfigError) as err:
        build_arms(validate(StudySpec, raw, source="spec.toml"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_run_ids_name_variants_and_keep_softmax_ids(study_data_dir: Path) -> None:
    spec = spec_of(study_data_dir)
    ref = build_arms(spec)[0]
    assert arm_tag(ref.model, ref.train) == ""
    assert run_id(ref, "muon", 0.02, 5_000_000_000, 42) == "san-L4-d32-muon-lr0.02-5B-s42"
    variant = ref.model.model_copy(update={"mixer": "non_approximate", "layout": "hybrid"})
    assert arm_tag(variant, {"freeze": ["qk"]}) == "hyb-nonapprox-frzqk"
    fqk = next(a for a in build_arms(spec_of(study_data_dir, matching={"arms": []}, arms=[
        {"name": "fqk", "model": {"ffn": True}, "train": {"freeze": ["qk"]}}])) if a.name == "fqk")
    assert run_id(fqk, "muon", 0.04, 1000, 1) == "fqk-frzqk-L4-d32-muon-lr0.04-1K-s1"
    assert fqk.label.endswith("frozen qk")
    named = next(a for a in build_arms(spec_of(study_data_dir, matching={"arms": []}, arms=[
        {"name": "hyb_nonapprox", "model": {"mixer": "non_approximate", "layout": "hybrid"}}])) if a.name != "san")
    assert run_id(named, "muon", 0.02, 1000, 1) == "hyb_nonapprox-L4-d32-muon-lr0.02-1K-s1"
