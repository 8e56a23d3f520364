"""The record kinds besides the matched study: a probe suite (SPEC §2) and a variants study
(SPEC §2–3). Their claims come from their results by the same machinery, each verdict
predicted from planted numbers: a probe difference counts beyond 2 binomial standard
errors, a variants step beyond the study's noise rule."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from sanlab.cli import main
from sanlab.probes.arms import PRESETS
from sanlab.records import kinds, marker, probes, variants
from sanlab.records.common import RecordError
from sanlab.records.export import export
from sanlab.study.plan import build_arms, noise_arm, round_lr, run_id
from sanlab.study.spec import StudySpec

# --------------------------------------------------------------------------- probes

RETRIEVAL = {"standard": 512, "frozen_qk": 493, "mixit": 40, "san": 512, "frozen_mlp": 512}  # of 512
# task -> (standard's correct, MixiT's correct, test examples)
MATCHES = {"addition": (469, 0, 512), "modadd": (24, 3, 24), "dyck": (511, 373, 512), "sentiment": (511, 281, 512)}
CAPACITY = {"standard": [(1000, 900), (4000, 2400), (16000, 2000)], "frozen_qk": [(1000, 900), (4000, 1800), (16000, 1500)],
            "mixit": [(1000, 800), (4000, 1600), (16000, 1200)], "frozen_mlp": [(1000, 500), (4000, 700), (16000, 650)]}
PARAMS = 8000


def _cell(task: str, arm: str, correct: int, total: int, n_train: int | None = None) -> dict[str, Any]:
    key = f"capacity-n{n_train}/{arm}" if task == "capacity" else f"{task}/{arm}"
    return {"key": key, "task": "memorize" if task == "capacity" else task, "arm": arm, "at_edge": False,
            "task_config": {"n_train": n_train, "alphabet": 16} if task == "capacity" else {"p": 31},
            "test_correct": correct, "test_total": total, "test_accuracy": correct / total}


def suite(retrieval: dict[str, int] | None = None, matches: dict[str, tuple[int, int, int]] | None = None,
          capacity: dict[str, list[tuple[int, int]]] | None = None) -> dict[str, Any]:
    retrieval = RETRIEVAL if retrieval is None else retrieval
    matches = MATCHES if matches is None else matches
    capacity = CAPACITY if capacity is None else capacity
    arms = ["standard", "san", "frozen_qk", "frozen_mlp", "mixit"]
    cells, table, caps = [], {a: {} for a in arms}, {}
    for arm, k in retrieval.items():
        cells.append(_cell("retrieval", arm, k, 512))
        table[arm]["retrieval"] = 100 * k / 512
    for task, (ks, km, n) in matches.items():
        for arm, k in (("standard", ks), ("mixit", km)):
            cells.append(_cell(task, arm, k, n))
            table[arm][task] = 100 * k / n
    for arm, pts in capacity.items():
        best_n, best_k = max(pts, key=lambda p: p[1])
        caps[arm] = {"bits_per_param": best_k * 4 / PARAMS, "n": best_n, "memorised": best_k, "params": PARAMS,
                     "alphabet": 16, "lower_bound": best_k >= best_n,
                     "points": [{"n": n, "memorised": k} for n, k in pts]}
        table[arm]["capacity"] = caps[arm]["bits_per_param"]
        cells += [_cell("capacity", arm, k, n, n) for n, k in pts]
    return {"quick": False, "tasks": ["addition", "modadd", "capacity", "retrieval", "dyck", "sentiment"],
            "arms": [{"name": a, "label": probes.LABELS[a], "overrides": list(PRESETS[a])} for a in arms],
            "table": table, "capacity": caps,
            "cells": cells}


def probe_record(tmp_path: Path, **kw: Any) -> probes.ProbeRecord:
    rec = tmp_path / "rec"
    rec.mkdir(parents=True)
    (rec / "suite.json").write_text(json.dumps(suite(**kw)))
    (rec / "record.json").write_text(marker.text("probes", ["suite.json"]))
    loaded = kinds.load(rec)
    assert loaded.kind.name == "probes"
    return loaded.data


def probe_verdicts(rec: probes.ProbeRecord) -> dict[str, str]:
    return {c.rule: c.verdict for c in probes.claims(rec)}


def test_the_standard_error_of_a_proportion() -> None:
    p = 494 / 514  # (k + 1) / (n + 2) for 493 of 512
    assert probes.proportion_se(493, 512) == pytest.approx(math.sqrt(p * (1 - p) / 514))
    assert probes.proportion_se(512, 512) > 0  # 100% still has an error


def test_probe_claims_from_planted_counts(tmp_path: Path) -> None:
    assert probe_verdicts(probe_record(tmp_path / "a")) == {
        "retrieval": "reproduced", "capacity": "reproduced", "capacity_fano": "reproduced", "mixit": "not reproduced"}
    # Frozen-QK above the standard arm by 6.25 points (2 se ≈ 2.2): the order is reversed.
    flipped = {**RETRIEVAL, "standard": 480, "frozen_qk": 512}
    assert probe_verdicts(probe_record(tmp_path / "b", retrieval=flipped))["retrieval"] == "not reproduced"
    # 512 vs 510 of 512: 0.4 points, within 2 se (0.8): inconclusive.
    close = {**RETRIEVAL, "frozen_qk": 510}
    assert probe_verdicts(probe_record(tmp_path / "c", retrieval=close))["retrieval"] == "inconclusive"
    missing = {k: v for k, v in RETRIEVAL.items() if k != "mixit"}
    assert probe_verdicts(probe_record(tmp_path / "d", retrieval=missing))["retrieval"] == "inconclusive"


def test_mixit_matches_the_standard_arm_within_the_equivalence_margin(tmp_path: Path) -> None:
    # 1.5 points short on every task, 2 se ≈ 1.4: surely within 5 points.
    near = {t: (509, 501, 512) for t in probes.MIXIT_MATCHES}
    assert probe_verdicts(probe_record(tmp_path / "a", matches=near))["mixit"] == "reproduced"
    # 4.5 points short on addition: within 5 points, but not by more than its noise.
    edge = {**near, "addition": (509, 486, 512)}
    assert probe_verdicts(probe_record(tmp_path / "b", matches=edge))["mixit"] == "inconclusive"
    # MixiT above the standard arm counts as ≈ (it is not behind).
    above = {**near, "dyck": (400, 512, 512)}
    assert probe_verdicts(probe_record(tmp_path / "c", matches=above))["mixit"] == "reproduced"
    # 24 of 24 each on a 24-example test split: 2 se ≈ 10.7 points, so even equal scores
    # cannot show "within 5 points".
    small = {**near, "modadd": (24, 24, 24)}
    assert probe_verdicts(probe_record(tmp_path / "d", matches=small))["mixit"] == "inconclusive"


def test_capacity_is_decided_only_when_the_maximum_over_n_is_bracketed(tmp_path: Path) -> None:
    one_n = {a: [pts[1]] for a, pts in CAPACITY.items()}
    rec = probe_record(tmp_path / "a", capacity=one_n)
    claim = next(c for c in probes.claims(rec) if c.rule == "capacity")
    assert claim.verdict == "inconclusive" and "(one N in the sweep)" in claim.measured
    rising = {**CAPACITY, "standard": [(1000, 900), (4000, 2400), (16000, 3000)]}  # best at the largest N
    assert probe_verdicts(probe_record(tmp_path / "b", capacity=rising))["capacity"] == "inconclusive"
    full = {**CAPACITY, "mixit": [(1000, 1000), (4000, 900)]}  # every pair of its best N memorised
    assert probe_verdicts(probe_record(tmp_path / "c", capacity=full))["capacity"] == "inconclusive"
    swapped = {**CAPACITY, "frozen_mlp": CAPACITY["standard"], "standard": CAPACITY["frozen_mlp"]}
    assert probe_verdicts(probe_record(tmp_path / "d", capacity=swapped))["capacity"] == "not reproduced"


def test_the_chance_free_capacity_reading_is_fanos_bound_and_gives_chance_nothing(tmp_path: Path) -> None:
    rec = probe_record(tmp_path / "a")
    fano = next(c for c in probes.claims(rec) if c.rule == "capacity_fano")
    # standard: the best N by Fano is 4000 (2400 right, a = 0.6):
    # 4000 · (4 − H2(0.6) − 0.4 · log2 15) bits over 8000 parameters
    h2 = -(0.6 * math.log2(0.6) + 0.4 * math.log2(0.4))
    want = 4000 * (4 - h2 - 0.4 * math.log2(15)) / PARAMS
    assert f"Standard {want:.2f}" in fano.measured and f"{want:.2f}" == "0.73"
    point = probes.capacity_point(rec, "standard", "fano")
    assert point is not None and point["value"] == pytest.approx(want) and point["n"] == 4000
    a = 2401 / 4002  # (k + 1) / (n + 2); the delta method's slope n·log2(a(A − 1)/(1 − a))
    assert point["se"] == pytest.approx(4000 * math.log2(a * 15 / (1 - a)) * math.sqrt(a * (1 - a) / 4002) / PARAMS)
    # Frozen-MLP a little above chance (1 in 16) at the largest N: the count's maximum is
    # there (4400 bits, so not bracketed), while Fano gives that N almost nothing and
    # finds its maximum at N = 1000, and decides the order.
    weak = {**CAPACITY, "frozen_mlp": [(1000, 500), (4000, 700), (16000, 1100)]}
    verdicts = probe_verdicts(probe_record(tmp_path / "b", capacity=weak))
    assert verdicts["capacity"] == "inconclusive" and verdicts["capacity_fano"] == "reproduced"
    assert probes.capacity_point(probes.load_probes(tmp_path / "b" / "rec"), "frozen_mlp", "fano")["n"] == 1000


def test_probe_blocks_hold_the_suites_numbers(tmp_path: Path) -> None:
    rec = probe_record(tmp_path)
    grid = probes.block_grid(rec)
    # count: 1800 × 4 / 8000 bits/param at N = 4000; chance removed: Fano's bound, also
    # largest at N = 4000 (a = 0.45); retrieval 493/512
    a = 0.45
    fano = 4000 * (4 + a * math.log2(a) + (1 - a) * math.log2(1 - a) - (1 - a) * math.log2(15)) / PARAMS
    assert f"{fano:.2f}" == "0.43"
    assert f"| Frozen-QK | – | – | 0.90 (N=4000) | {fano:.2f} (N=4000) | 96.3 | – | – |" in grid
    assert ("| arm | Addition | Mod. add. (p=31) | Memorization bits/param, count | "
            "Memorization bits/param, chance removed |") in grid
    # the count's maximum at the largest N is not bracketed: marked †; Fano's at N = 1000 is
    weak = probe_record(tmp_path / "weak", capacity={**CAPACITY, "frozen_mlp": [(1000, 500), (4000, 700),
                                                                              (16000, 1100)]})
    # 1100 × 4 / 8000 = 0.55 at N = 16000; 1000 · (4 − H₂(0.5) − 0.5 · log2 15) / 8000 = 0.13
    assert "| Frozen-MLP | – | – | 0.55 (N=16000)† | 0.13 (N=1000) | 100.0 |" in probes.block_grid(weak)
    # `*` marks the reading whose N's cell locked an LR at the edge of its sweep, not the other
    suite_data = json.loads((tmp_path / "weak" / "rec" / "suite.json").read_text())
    next(c for c in suite_data["cells"] if c["key"] == "capacity-n16000/frozen_mlp")["at_edge"] = True
    (tmp_path / "weak" / "rec" / "suite.json").write_text(json.dumps(suite_data))
    edged = probes.load_probes(tmp_path / "weak" / "rec")
    assert "| Frozen-MLP | – | – | 0.55 (N=16000)†* | 0.13 (N=1000) | 100.0 |" in probes.block_grid(edged)
    assert "| MixiT | 11.2 | 2.18 |" in probes.block_paper(rec)
    claims = probes.block_claims(rec)
    for rule in probes.RULES.values():
        assert rule in claims


def _ablation_file(rec_dir: Path, ablated: int, reference: int, total: int = 512) -> None:
    """A `probe addition --arms mixit --arm 'mixit_row: …'` results file beside suite.json."""
    mixit = {"name": "mixit", "label": "MixiT", "overrides": ["model.ffn=true", "model.mixer=mixit"]}
    row = {"name": "mixit_row", "label": "mixit_row",
           "overrides": [*mixit["overrides"], "model.mixer_options.sigma_length=row"]}
    cells = [{**_cell("addition", "mixit", reference, total), "lr": 0.04},
             {**_cell("addition", "mixit_row", ablated, total), "lr": 0.02}]
    (rec_dir / "probe-addition.json").write_text(json.dumps({"arms": [mixit, row], "cells": cells}))


def test_probe_ablations_are_measured_against_the_arm_they_change(tmp_path: Path) -> None:
    rec = probe_record(tmp_path)
    assert probes.ablations(rec) == [] and "No ablation runs" in probes.block_ablations(rec)
    # A single-task file with only suite arms is not an ablation; one with an extra arm is.
    (rec.dir / "probe-dyck.json").write_text(json.dumps({"arms": [{"name": "standard"}], "cells": []}))
    _ablation_file(rec.dir, ablated=40, reference=120)
    assert probes.ablation_files(rec.dir, rec.suite) == ["probe-addition.json"]
    assert kinds._probe_files(rec.dir) == ["suite.json", "probe-addition.json"]
    (row,) = probes.ablations(kinds.load(rec.dir).data)
    assert row["reference"] == "mixit" and row["changes"] == ["model.mixer_options.sigma_length=row"]
    p1, p2 = 41 / 514, 121 / 514
    se = math.sqrt(p1 * (1 - p1) / 514 + p2 * (1 - p2) / 514)
    assert row["diff"] == pytest.approx(40 / 512 - 120 / 512) and row["se"] == pytest.approx(se)
    assert row["sign"] == -1  # 15.6 points below, 2 se ≈ 4.4
    block = probes.block_ablations(kinds.load(rec.dir).data)
    assert ("| Addition | `mixit_row` | `model.mixer_options.sigma_length=row` | 7.8 (40/512), lr 0.02 | "
            "MixiT: 23.4 (120/512), lr 0.04 | -15.6 ± 4.4 | lower beyond noise |") in block
    _ablation_file(rec.dir, ablated=118, reference=120)  # 0.4 points: within noise
    assert probes.ablations(kinds.load(rec.dir).data)[0]["sign"] == 0
    (rec.dir / "probe-addition.json").write_text("[1]")
    with pytest.raises(RecordError, match="not a probe's results"):
        kinds.load(rec.dir)


def test_an_ablations_reference_arm_reads_the_overrides_values_not_their_spelling() -> None:
    """`train.freeze=[qk]` (what a shell leaves of `train.freeze=["qk"]` in a quoted
    `--arm`) extends the Frozen-QK preset, not the standard arm, and is not a change."""
    suite_arms = [{"name": a, "overrides": list(PRESETS[a])} for a in ("standard", "frozen_qk")]
    for spelling in ("train.freeze=[qk]", 'train.freeze=["qk"]', "train.freeze=[ qk ]"):
        arm = {"name": "fqk_4x", "overrides": ["model.ffn=true", spelling, "train.steps=12000"]}
        assert probes.reference_arm(arm, suite_arms)["name"] == "frozen_qk", spelling
    arm = {"name": "fmlp", "overrides": ["model.ffn=true", "train.freeze=[mlp]"]}
    assert probes.reference_arm(arm, suite_arms)["name"] == "standard"  # another value: not Frozen-QK


# --------------------------------------------------------------------------- variants

VSPEC = {
    "name": "variants", "seeds": [1, 2], "data": {"seq_len": 32, "corpus": "synth", "tokens": 20000},
    "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "state_mixer": "swiglu"},
    "matching": {"arms": []}, "sweep": {"enabled": False}, "final": {"tokens": [1000]},
    "arms": [{"name": "nonapprox", "model": {"mixer": "non_approximate"}},
             {"name": "hyb_nonapprox", "model": {"mixer": "non_approximate", "layout": "hybrid"}},
             {"name": "approx", "model": {"mixer": "approximate"}},
             {"name": "static_emb_qk", "model": {"mixer": "static_emb_qk"}},
             {"name": "mlp", "model": {"mixer": "mlp"}},
             {"name": "mixit", "model": {"mixer": "mixit", "mixer_options": {"seq_len": 32}}},
             {"name": "frozen_qk", "train": {"freeze": ["qk"]}},
             {"name": "san", "model": {"state_mixer": "none"}}],
}
LOSS = {"ref": 3.0, "hyb_nonapprox": 3.05, "approx": 3.2, "static_emb_qk": 3.5, "mlp": 4.0, "nonapprox": 5.0,
        "frozen_qk": 3.3, "mixit": 3.9, "san": 3.4}
JITTER = {1: 0.001, 2: -0.001}
NOISE = {1: 0.002, 2: -0.003}  # F = 0.0035


def write_variants_study(study: Path, loss: dict[str, float] | None = None, noise: dict[int, float] | None = None) -> Path:
    loss = LOSS if loss is None else loss
    noise = NOISE if noise is None else noise
    spec = StudySpec.model_validate(copy.deepcopy(VSPEC))
    arms = build_arms(spec)
    study.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True)))
    ref_lr = round_lr(arms[0].base_lr_for(spec, "muon"))
    lines = []
    for seed in spec.seeds:
        entries = [(a, round_lr(a.base_lr_for(spec, "muon")), loss[a.name] + JITTER[seed]) for a in arms]
        if seed in noise:
            entries.append((noise_arm(spec), ref_lr, loss[arms[0].name] + JITTER[seed] + noise[seed]))
        for arm, lr, value in entries:
            lines.append(json.dumps({"type": "run", "run_id": run_id(arm, "muon", lr, 1000, seed), "arm": arm.name,
                                     "optimizer": "muon", "seed": seed, "tokens": 1000, "status": "completed",
                                     "final": {"val_loss": value}}))
    (study / "results.jsonl").write_text("\n".join(lines) + "\n")
    return study


def variants_record(tmp_path: Path, **kw: Any) -> Any:
    write_variants_study(tmp_path / "study", **kw)
    export(tmp_path / "study", tmp_path / "rec", log=lambda s: None)
    loaded = kinds.load(tmp_path / "rec")
    assert loaded.kind.name == "variants"
    return loaded.data


def test_variant_arms_are_recognised_from_what_the_study_built(tmp_path: Path) -> None:
    rec = variants_record(tmp_path)
    assert variants.variants(rec) == {"standard": "ref", "nonapprox_uniform": "nonapprox",
                                      "nonapprox_hybrid": "hyb_nonapprox", "approximate": "approx",
                                      "static_emb_qk": "static_emb_qk", "mlp": "mlp", "mixit": "mixit",
                                      "frozen_qk": "frozen_qk"}  # the SAN is none of SPEC §2–3's variants


def test_variants_claims_from_planted_losses(tmp_path: Path) -> None:
    rec = variants_record(tmp_path / "a")
    v = {c.rule: c.verdict for c in variants.claims(rec)}
    assert v == {"ppl": "reproduced", "hybrid": "reproduced", "lm": "reproduced", "nlu": "inconclusive",
                 "activations": "inconclusive"}  # no final run analysed
    ppl = next(c for c in variants.claims(rec) if c.rule == "ppl")
    assert ppl.measured.startswith("at 1K: standard 3.0000, Non-approximate (hybrid) 3.0500, Approximate 3.2000, "
                                   "StaticEmbQK 3.5000, MLP (uniform) 4.0000, Non-approximate (uniform) 5.0000; steps "
                                   "+0.0500 ± 0.0000, +0.1500 ± 0.0000, +0.3000 ± 0.0000, +0.5000 ± 0.0000, "
                                   "+1.0000 ± 0.0000; F = 0.0035")
    # Approximate and StaticEmbQK swapped: a step reversed beyond the noise.
    swapped = {**LOSS, "approx": 3.5, "static_emb_qk": 3.2}
    assert {c.rule: c.verdict for c in variants.claims(variants_record(tmp_path / "b", loss=swapped))}["ppl"] == \
        "not reproduced"
    # The hybrid 0.002 behind the standard arm: within F, so the ordering is inconclusive,
    # while the hybrid still beats the uniform Non-approximate arm.
    close = {**LOSS, "hyb_nonapprox": 3.002}
    v = {c.rule: c.verdict for c in variants.claims(variants_record(tmp_path / "c", loss=close))}
    assert v["ppl"] == "inconclusive" and v["hybrid"] == "reproduced"
    # No noise pair: nothing is told apart.
    v = {c.rule: c.verdict for c in variants.claims(variants_record(tmp_path / "d", noise={}))}
    assert v == {"ppl": "inconclusive", "hybrid": "inconclusive", "lm": "inconclusive", "nlu": "inconclusive",
                 "activations": "inconclusive"}


def test_a_variants_record_gets_its_own_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    variants_record(tmp_path)
    rec = tmp_path / "rec"
    assert main(["record", "readme", str(rec)]) == 0
    text = (rec / "README.md").read_text()
    for name in variants.BLOCKS:
        assert f"<!-- records:BEGIN {name} -->" in text
    assert "<!-- records:BEGIN regions -->" not in text  # a matched study's block
    row = next(ln for ln in text.splitlines() if ln.startswith("| approx |"))
    assert "| Approximate |" in row and "| 3.2000 ± 0.0014 |" in row and "| 24.5 |" in row and "| 47.9 |" in row
    assert main(["record", "check", str(rec)]) == 0


ABL_ARMS = [{"name": "mixit_row", "model": {"mixer": "mixit", "mixer_options": {"seq_len": 32, "sigma_length": "row"}}},
            {"name": "frozen_qk_proj", "train": {"freeze": ["qk_proj"]}},
            {"name": "nonapprox_qknorm", "model": {"mixer": "non_approximate", "mixer_options": {"qk_norm": True}}}]


def test_ablation_arms_are_not_the_variants_and_their_gaps_are_read_per_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The previous forms (MixiT σ_h(seq_len), Frozen-QK with trainable gains, Non-approximate
    with QK-norm) are ablations: the variant stays the paper's form, and the ablations block
    gives loss(previous) − loss(paper's form) per seed pair with the noise rule's reading."""
    monkeypatch.setitem(VSPEC, "arms", VSPEC["arms"] + ABL_ARMS)
    loss = {**LOSS, "mixit_row": 3.95, "frozen_qk_proj": 3.3005, "nonapprox_qknorm": 4.0}
    rec = variants_record(tmp_path, loss=loss)
    assert variants.variants(rec)["mixit"] == "mixit" and variants.variants(rec)["frozen_qk"] == "frozen_qk"
    assert variants.variants(rec)["nonapprox_uniform"] == "nonapprox"
    assert variants.ablations(rec) == {"mixit": "mixit_row", "frozen_qk": "frozen_qk_proj",
                                       "nonapprox_uniform": "nonapprox_qknorm"}
    text = variants.block_ablations(rec)
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln}
    assert "| +0.0500 ± 0.0000 | previous form worse |" in rows["MixiT"]
    assert "| +0.0005 ± 0.0000 | within noise |" in rows["Frozen-QK"]  # 0.0005 < F = 0.0035
    assert "| −1.0000 ± 0.0000 | previous form better |" in rows["Non-approximate (uniform)"]


def test_largest_activation_block_and_claim_from_planted_stream_peaks(tmp_path: Path) -> None:
    rec = variants_record(tmp_path)
    big = rec.largest
    peaks = {"nonapprox": {1: [1.0, 900.0, 40.0], 2: [1.0, 1100.0, 60.0]},
             "hyb_nonapprox": {1: [1.0, 30.0, 20.0], 2: [1.0, 50.0, 10.0]}}
    for g in rec.gaps_at(big):
        for seed, ids in g["runs"].items():
            if g["arm"] in peaks:
                rec.analyses.append({"runs": {ids["arm"]: {"stream": [
                    {"hook": f"h{i}", "max_abs": x} for i, x in enumerate(peaks[g["arm"]][int(seed)])]}}})
    assert variants.peak_activations(rec, "nonapprox", big) == peaks["nonapprox"]
    text = variants.block_activations(rec)
    row = next(ln for ln in text.splitlines() if ln.startswith("| nonapprox |"))
    assert row == "| nonapprox | 1000.0 | 1.0 | 1000.0 | 50.0 |"  # per hook: the mean over seeds
    claim = next(c for c in variants.claims(rec) if c.rule == "activations")
    assert claim.verdict == "reproduced" and "ratio 30.00, 22.00" in claim.measured  # 900/30, 1100/50
    peaks["hyb_nonapprox"] = {1: [1.0, 3000.0], 2: [1.0, 50.0]}  # seed 1 reversed: mixed → inconclusive
    rec.analyses.clear()
    for g in rec.gaps_at(big):
        for seed, ids in g["runs"].items():
            if g["arm"] in peaks:
                rec.analyses.append({"runs": {ids["arm"]: {"stream": [
                    {"hook": f"h{i}", "max_abs": x} for i, x in enumerate(peaks[g["arm"]][int(seed)])]}}})
    assert next(c for c in variants.claims(rec) if c.rule == "activations").verdict == "inconclusive"


def test_the_floor_block_gives_each_variant_arm_its_own_loss(tmp_path: Path) -> None:
    """A variants study's arms all share one role; the floor block still reads each arm's own
    mean loss (and loss above the floor), not the first arm's for every row."""
    rec = variants_record(tmp_path)
    from sanlab.records.study import block_floor

    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in block_floor(rec).splitlines() if line.startswith("| ") and " | 1K | " in line}
    assert rows, block_floor(rec)
    for name, loss in LOSS.items():
        label = "ref" if name == "ref" else next(k for k in rows if k.startswith(name + " ("))
        assert float(rows[label][2]) == pytest.approx(loss, abs=1e-4), label  # mean of ±0.001 jitter
