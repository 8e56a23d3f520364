"""sanlab.records (`sanlab record`): a record's README tables and claim verdicts come from its committed
study, `--check` catches a README that no longer equals them, and `export` copies a study
dir without checkpoints or shards so that the tables and the report still regenerate.

The study dirs here are written by hand (spec, results store, analysis files, entropy
floor) with known numbers, so every block and verdict can be predicted."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from sanlab import records
from sanlab.cli import main as sanlab_main
from sanlab.records import marker, matched
from sanlab.records.export import export
from sanlab.study.plan import build_arms, noise_arm, round_lr, run_id
from sanlab.study.spec import StudySpec

ROOT = Path(__file__).resolve().parent.parent

SPEC = {
    "name": "rec", "seeds": [1, 2], "data": {"seq_len": 32, "corpus": "synth", "tokens": 20000},
    "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
    "matching": {"arms": ["iso_param", "iso_flop", "iso_depth"], "policy": "nearest", "tolerance": None},
    "sweep": {"enabled": False}, "final": {"tokens": [1000, 2000]},
}
BUDGETS = (1000, 2000)
REF_LOSS = {1000: 3.2, 2000: 3.0}
# Δ = arm − SAN per budget; the noise pair (at 2000) is +0.002 / −0.003: mean −0.0005, sd
# 0.0035, so the floor's size F = 0.0035 (`sanlab.study.noise`).
GAPS = {"iso_param": {1000: -0.20, 2000: -0.10}, "iso_flop": {1000: -0.30, 2000: -0.25},
        "iso_depth": {1000: -0.50, 2000: -0.45}}
NOISE = {1: 0.002, 2: -0.003}
JITTER = {1: 0.001, 2: -0.001}
SHARES = {"query": 0.06, "trace": 0.57, "answer": 0.36, "other": 0.01}
REGION_D = {"query": -0.30, "trace": -0.08, "answer": -0.10, "other": 0.0}
EXERCISES = {"memorization": (400, -0.30), "rag": (300, 0.05), "math": (300, 0.04)}  # tokens, Δ
CRYS = {"Q": 0.25, "K": 0.25, "V": 0.75, "O": None, "down": 0.75}
FLOOR = 0.5


def write_marker(record: Path, kind: str = "matched") -> None:
    """record.json listing what is under study/ and report/ as the record's own files."""
    files = [f.relative_to(record).as_posix() for top in ("study", "report") if (record / top).is_dir()
             for f in sorted((record / top).rglob("*")) if f.is_file()]
    (record / "record.json").write_text(marker.text(kind, files))


def write_study(study: Path, *, gaps: dict[str, dict[int, float]] | None = None,
                region_d: dict[str, float] | None = None, exercises: dict[str, tuple[int, float]] | None = None,
                crys: dict[str, float | None] | None = None, seeds: tuple[int, ...] = (1, 2),
                analysed_seeds: tuple[int, ...] | None = None, rel_error: float = 0.0,
                noise: dict[int, float] | None = None, analysis_root: str = "elsewhere/study",
                region_jitter: dict[str, dict[int, float]] | None = None,
                budgets: tuple[int, ...] = BUDGETS, ref_loss: dict[int, float] | None = None) -> Path:
    """A finished study dir with known numbers: spec, results store, analysis of the final
    pairs at the largest budget (one file per seed), data/manifest.json and the floor."""
    gaps = GAPS if gaps is None else gaps
    region_d = REGION_D if region_d is None else region_d
    exercises = EXERCISES if exercises is None else exercises
    crys = CRYS if crys is None else crys
    noise = NOISE if noise is None else noise
    analysed = seeds if analysed_seeds is None else analysed_seeds
    ref_loss = REF_LOSS if ref_loss is None else ref_loss
    raw = copy.deepcopy(SPEC)
    raw["seeds"] = list(seeds)
    raw["final"] = {"tokens": list(budgets)}
    spec = StudySpec.model_validate(raw)
    arms = build_arms(spec)
    ref = arms[0]
    study.mkdir(parents=True, exist_ok=True)
    (study / "study.json").write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True), indent=2))

    def rid(arm: Any, tokens: int, seed: int) -> str:
        return run_id(arm, "muon", round_lr(arm.base_lr_for(spec, "muon")), tokens, seed)

    lines, losses = [], {}
    for tokens in budgets:
        for seed in seeds:
            entries = [(ref, ref_loss[tokens])]
            entries += [(a, ref_loss[tokens] + gaps[a.name][tokens] + JITTER[seed]) for a in arms[1:]]
            if tokens == max(budgets) and seed in noise:
                entries.append((noise_arm(spec), ref_loss[tokens] + noise[seed]))
            for arm, loss in entries:
                r = rid(arm, tokens, seed)
                losses[r] = loss
                lines.append(json.dumps({
                    "type": "run", "run_id": r, "arm": arm.name, "optimizer": "muon", "seed": seed,
                    "tokens": tokens, "status": "completed", "phases": ["final"],
                    "run_dir": f"runs/{r}", "final": {"val_loss": loss, "tokens": tokens},
                    "config": {"data": {"dir": "../../data", "seq_len": 32}}}))
                run = study / "runs" / r
                run.mkdir(parents=True, exist_ok=True)
                (run / "config.json").write_text(json.dumps({"data": {"dir": "../../data"}}))
                (run / "meta.json").write_text(json.dumps({"status": "completed"}))
                (run / "metrics.jsonl").write_text(json.dumps({"tokens": tokens, "loss": loss}) + "\n")
    (study / "results.jsonl").write_text("\n".join(lines) + "\n")

    tokens = max(budgets)
    for seed in analysed:
        j = JITTER[seed] / 10  # a small seed-to-seed spread of the region / exercise Δs
        runs: dict[str, Any] = {}
        comparisons = []
        ref_id = rid(ref, tokens, seed)
        for arm in arms:
            r = rid(arm, tokens, seed)
            loss = losses[r]
            runs[r] = {
                "path": f"{analysis_root}/runs/{r}",
                "losses": {"loss": loss, "region": [
                    {"group": g, "tokens": int(1000 * s), "token_share": s, "loss": loss, "loss_share": s,
                     "entropy_floor": FLOOR if g != "other" else 0.0,
                     "loss_above_floor": loss - (FLOOR if g != "other" else 0.0)} for g, s in SHARES.items()]},
                "spectra": {"tol": 0.02, "per_matrix": [], "per_type": [], "crystallisation": [
                    {"type": t, "milestone": m, "distances": []} for t, m in crys.items()
                    if t != "down" or arm is not ref]},
            }
            if arm is ref:
                continue
            rj = {g: (region_jitter or {}).get(g, {}).get(seed, 0.0) for g in SHARES}
            rows = [{"group": g, "tokens": int(1000 * s), "token_share": s, "delta": d + j + rj[g],
                     "weighted": s * (d + j + rj[g])} for g, (s, d) in ((g, (SHARES[g], region_d[g])) for g in SHARES)]
            agg = sum(r_["weighted"] for r_ in rows)
            total = sum(n for n, _ in exercises.values())
            ex_rows = [{"group": g, "tokens": n, "token_share": n / total, "delta": d + j}
                       for g, (n, d) in exercises.items()]
            comparisons.append({"run": r, "vs": ref_id, "tokens": 1000, "region": {
                "rows": rows, "identity": {"aggregate_delta": agg * (1 + rel_error), "weighted_sum": agg,
                                           "abs_error": abs(agg * rel_error), "rel_error": rel_error}},
                "exercise": {"rows": ex_rows, "identity": {}}})
        out = study / "analysis" / f"final-muon-{tokens}-s{seed}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "analysis.json").write_text(json.dumps({
            "runs": runs, "comparisons": comparisons,
            "sample": {"data_dir": f"{analysis_root}/data",
                       "entropy_floor_file": f"{analysis_root}/data/entropy_floor.json"}}))
        (out / "deltas.csv").write_text("run,vs,grouping,group,delta\n")
    data = study / "data"
    data.mkdir(exist_ok=True)
    (data / "manifest.json").write_text(json.dumps({"exercises": list(exercises)}))
    (data / "entropy_floor.json").write_text(json.dumps({
        "format": "sanlab-entropy-floor", "splits": {"val": {"nats_per_token": FLOOR}}}))
    return study


def make_record(tmp_path: Path, name: str = "rec", readme: str | None = None, toml: str | None = None,
                **kw: Any) -> Path:
    rec = tmp_path / name
    write_study(rec / "study", **kw)
    write_marker(rec)
    if readme is not None:
        (rec / "README.md").write_text(readme)
    if toml is not None:
        (rec / "record.toml").write_text(toml)
    return rec


def load(rec_dir: Path) -> Any:
    return records.load(rec_dir).data


def verdicts(rec_dir: Path) -> dict[str, str]:
    rec = load(rec_dir)
    return {c.claim.split(":")[0].split(" (")[0]: c.verdict for c in matched.claims(rec)}


ORDER = "ordering of the gaps"
SHRINK = "the iso-param gap shrinks with tokens"
QUERY = "the SAN's deficit is concentrated on query tokens"
EXER = "recall types favour the standard arm, context-grounded types the SAN"
IDENT = "token-weighted region Δs reproduce the aggregate Δ"
CRYST = "Q/K crystallise before V/O/FFN-down"
REAL = "the real-text gap is larger than the embedded corpus's"


# --------------------------------------------------------------------------- blocks and verdicts


def test_claims_reproduced_when_the_planted_numbers_show_them(tmp_path: Path) -> None:
    v = verdicts(make_record(tmp_path))
    assert v == {ORDER: "reproduced", SHRINK: "reproduced", QUERY: "reproduced", EXER: "reproduced",
                 IDENT: "holds", CRYST: "reproduced"}


def test_swapping_two_arms_losses_flips_the_ordering(tmp_path: Path) -> None:
    gaps = {**GAPS, "iso_param": GAPS["iso_depth"], "iso_depth": GAPS["iso_param"]}
    assert verdicts(make_record(tmp_path, gaps=gaps))[ORDER] == "not reproduced"


def test_a_gap_difference_within_the_noise_floor_is_inconclusive(tmp_path: Path) -> None:
    # iso-FLOP 0.003 ahead of iso-param in both seed pairs: below F = 0.0035 (no spread).
    gaps = {**GAPS, "iso_flop": {1000: -0.30, 2000: -0.103}}
    assert verdicts(make_record(tmp_path, gaps=gaps))[ORDER] == "inconclusive"
    # 0.004 is beyond it: the same rule the study table reads its gaps by.
    gaps = {**GAPS, "iso_flop": {1000: -0.30, 2000: -0.104}}
    assert verdicts(make_record(tmp_path / "b", gaps=gaps))[ORDER] == "reproduced"
    # A noisier floor (+0.25 / −0.01: mean 0.12, sd 0.184, F = 0.184) makes the planted step
    # of 0.15 inconclusive as well.
    assert verdicts(make_record(tmp_path / "c", noise={1: 0.25, 2: -0.01}))[ORDER] == "inconclusive"


def test_the_iso_param_gap_growing_with_tokens_is_not_reproduced(tmp_path: Path) -> None:
    gaps = {**GAPS, "iso_param": {1000: -0.10, 2000: -0.20}}
    assert verdicts(make_record(tmp_path, gaps=gaps))[SHRINK] == "not reproduced"
    gaps = {**GAPS, "iso_param": {1000: -0.103, 2000: -0.10}}  # shrinks by 0.003 < F
    assert verdicts(make_record(tmp_path / "b", gaps=gaps))[SHRINK] == "inconclusive"


THREE = (1000, 2000, 3000)
THREE_REF = {1000: 3.4, 2000: 3.2, 3000: 3.0}
THREE_GAPS = {"iso_flop": {1000: -0.60, 2000: -0.60, 3000: -0.60}, "iso_depth": {1000: -0.90, 2000: -0.90, 3000: -0.90}}
NOISE_001 = {1: 0.01, 2: 0.01}  # F = 0.01 (mean 0.01, sd 0)


def test_a_gap_that_grows_on_the_way_does_not_shrink(tmp_path: Path) -> None:
    """|Δ| 0.30 → 0.50 → 0.10 with F = 0.01: smaller at the end, but the middle step grew by
    0.20 ≫ F, so the claim is inconclusive (the verdict must read every budget)."""
    grows = {**THREE_GAPS, "iso_param": {1000: -0.30, 2000: -0.50, 3000: -0.10}}
    rec = make_record(tmp_path / "a", gaps=grows, budgets=THREE, ref_loss=THREE_REF, noise=NOISE_001)
    assert verdicts(rec)[SHRINK] == "inconclusive"
    claim = next(c for c in matched.claims(load(rec)) if c.claim.startswith(SHRINK))
    assert claim.measured.startswith("−0.3000 (1K), −0.5000 (2K), −0.1000 (3K); F = 0.0100")
    steady = {**THREE_GAPS, "iso_param": {1000: -0.30, 2000: -0.20, 3000: -0.10}}
    rec = make_record(tmp_path / "b", gaps=steady, budgets=THREE, ref_loss=THREE_REF, noise=NOISE_001)
    assert verdicts(rec)[SHRINK] == "reproduced"
    # A middle step that grows by less than F is within noise: still shrinking.
    flat = {**THREE_GAPS, "iso_param": {1000: -0.30, 2000: -0.305, 3000: -0.10}}
    rec = make_record(tmp_path / "c", gaps=flat, budgets=THREE, ref_loss=THREE_REF, noise=NOISE_001)
    assert verdicts(rec)[SHRINK] == "reproduced"


def test_query_claim_follows_the_region_deltas_read_against_the_noise(tmp_path: Path) -> None:
    flipped = {**REGION_D, "query": -0.02, "trace": -0.10}
    assert verdicts(make_record(tmp_path / "a", region_d=flipped))[QUERY] == "not reproduced"
    # One analysed pair has no spread: its query − trace of −0.22 is read against F alone,
    # as the study table reads a one-seed gap.
    assert verdicts(make_record(tmp_path / "b", analysed_seeds=(1,)))[QUERY] == "reproduced"
    # Without a noise pair nothing is told apart.
    assert verdicts(make_record(tmp_path / "d", noise={}))[QUERY] == "inconclusive"
    # Query Δ −0.05 and −0.55 over the two seeds: more negative than trace on average, but
    # by less than 2 × the seed sd of the difference.
    noisy = {"query": {1: 0.25, 2: -0.25}}
    assert verdicts(make_record(tmp_path / "c", region_jitter=noisy))[QUERY] == "inconclusive"


def test_exercise_claim_recall_vs_context(tmp_path: Path) -> None:
    all_standard = {"memorization": (400, -0.30), "rag": (300, -0.20), "math": (300, -0.20)}
    assert verdicts(make_record(tmp_path / "a", exercises=all_standard))[EXER] == "not reproduced"
    rec = make_record(tmp_path / "b", exercises={"text": (1000, -0.1)})
    assert verdicts(rec)[EXER] == "inconclusive"
    assert matched.block_exercises(load(rec)) == "No exercise types in this corpus."


def test_identity_and_crystallisation_verdicts(tmp_path: Path) -> None:
    v = verdicts(make_record(tmp_path / "a", rel_error=0.03, crys={**CRYS, "V": 0.25}))
    assert v[IDENT] == "does not hold"  # a check, not a claim: its own words
    assert v[CRYST] == "not reproduced"  # V settles with Q/K in every run
    v = verdicts(make_record(tmp_path / "b", crys={t: None for t in CRYS}))
    assert v[CRYST] == "inconclusive"  # nothing settles: nothing decided


def test_blocks_hold_the_planted_numbers(tmp_path: Path) -> None:
    rec = load(make_record(tmp_path))
    gaps = matched.block_gaps(rec)
    # iso-param at 2K: Δ per seed −0.10 ± 0.001, the SAN at 3.0; the paper's number beside it.
    row = next(ln for ln in gaps.splitlines() if ln.startswith("| 2K | iso_param"))
    assert "| 3.0000 |" in row and "s1: −0.0990 s2: −0.1010" in row and "−0.1000 ± 0.0014" in row
    assert "s1: +0.0020 s2: −0.0030" in row and "−0.0055 at 105B" in row
    assert "−0.263" in next(ln for ln in gaps.splitlines() if ln.startswith("| 2K | iso_flop"))
    floor = matched.block_floor(rec)
    # The SAN at 2K: 3.0 against the floor 0.5, 0.2 lower than at 1K (beyond F: still falling).
    assert "| san | 2K | 3.0000 | 0.5000 | 2.5000 | −0.2000 | yes |" in floor
    assert ("every arm above the floor by more than the noise: yes; still falling: san, iso_param (iso-param), "
            "iso_flop (iso-FLOP), iso_depth (iso-depth).") in floor
    ident = matched.block_identity(rec)
    assert "| iso_param (iso-param) | 2K | s1 | −0.0995 | −0.0995 | −0.0990 | 0.0000% |" in ident
    regions = matched.block_regions(rec)
    assert "| query | 6.0% | 6.0% | 5.8% / 7.9% | −0.3000 ± 0.0001 |" in regions
    ex = matched.block_exercises(rec)
    assert "| memorization | recall | 40.0% | −0.3000 ± 0.0001 |" in ex
    assert "| rag | context-grounded | 30.0% |" in ex
    crys = matched.block_crystallisation(rec)
    assert "| iso_param (iso-param) | s1, s2 | 25%, 25% | 25%, 25% | 75%, 75% | never, never | 75%, 75% |" in crys
    claims = matched.block_claims(rec)
    for rule in ("ordering", "shrinking", "query", "exercise", "identity", "crystallisation"):
        assert matched.RULES[rule] in claims
    assert matched.RULES["compare"] not in claims  # no comparison record named


def test_floor_block_says_when_an_arm_stopped_falling(tmp_path: Path) -> None:
    # iso-param at 3.0 (mean over seeds) at both budgets: no longer falling.
    flat = {**GAPS, "iso_param": {1000: -0.2, 2000: 0.0}}
    floor = matched.block_floor(load(make_record(tmp_path, gaps=flat)))
    assert "| iso_param (iso-param) | 2K | 3.0000 | 0.5000 | 2.5000 | +0.0000 | no |" in floor
    assert "still falling: san, iso_flop (iso-FLOP), iso_depth (iso-depth)." in floor
    # A floor within T of the SAN's loss: not every arm is measurably above it.
    rec = make_record(tmp_path / "b")
    high = {"splits": {"val": {"nats_per_token": 2.998}}}
    (rec / "study" / "data" / "entropy_floor.json").write_text(json.dumps(high))
    assert "every arm above the floor by more than the noise: no;" in matched.block_floor(load(rec))


def test_comparison_record_and_prediction(tmp_path: Path) -> None:
    make_record(tmp_path, "2026-12-01-synth", gaps={**GAPS, "iso_param": {1000: -0.05, 2000: -0.02}})
    real = make_record(tmp_path, "2026-12-01-kjv",
                       toml='compare_with = "2026-12-01-synth"\nprediction = "gap 0.05-0.1 nats"\n')
    assert verdicts(real)[REAL] == "reproduced"  # |−0.10| here vs |−0.02| there, T = 0.006
    text = matched.block_claims(load(real))
    assert "gap 0.05-0.1 nats" in text and matched.RULES["compare"] in text
    missing = make_record(tmp_path, "lonely", toml='compare_with = "nowhere"\n')
    assert verdicts(missing)[REAL] == "inconclusive"


# --------------------------------------------------------------------------- the README command


README = """# A record

Hand-written prose stays.

<!-- records:BEGIN gaps -->
<!-- records:END gaps -->

More prose.

<!-- records:BEGIN claims -->
old
<!-- records:END claims -->
"""


def test_readme_write_then_check_then_edit_fails_then_regenerate_passes(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rec = make_record(tmp_path, readme=README)
    assert sanlab_main(["record", "check", str(rec)]) == 1  # empty blocks differ
    assert sanlab_main(["record", "readme", str(rec)]) == 0
    text = (rec / "README.md").read_text()
    assert "Hand-written prose stays." in text and "More prose." in text
    assert "−0.1000 ± 0.0014" in text and "\nold\n" not in text
    assert sanlab_main(["record", "check", str(rec)]) == 0
    (rec / "README.md").write_text(text.replace("−0.1000 ± 0.0014", "−0.1001 ± 0.0014", 1))
    capsys.readouterr()
    assert sanlab_main(["record", "check", str(rec)]) == 1
    out = capsys.readouterr().out
    assert "'gaps'" in out and "'claims'" not in out
    assert (rec / "README.md").read_text() != text  # --check wrote nothing
    assert sanlab_main(["record", "readme", str(rec)]) == 0
    assert sanlab_main(["record", "check", str(rec)]) == 0
    # A result changes: the README no longer equals the committed results.
    store = rec / "study" / "results.jsonl"
    store.write_text(store.read_text().replace('"val_loss": 3.0,', '"val_loss": 3.01,'))
    assert sanlab_main(["record", "check", str(rec)]) == 1


def test_check_fails_naming_a_file_the_marker_lists_that_is_not_there(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A record is committed whole: a file record.json lists but the dir lacks (a path git
    ignored, a file lost) fails `record check`, naming the file, even with every README
    block equal to its results."""
    rec = make_record(tmp_path, readme=README)
    assert sanlab_main(["record", "readme", str(rec)]) == 0
    assert sanlab_main(["record", "check", str(rec)]) == 0
    listed = json.loads((rec / "record.json").read_text())["files"]
    gone = next(f for f in listed if f.endswith("/config.json"))
    (rec / gone).unlink()
    capsys.readouterr()
    assert sanlab_main(["record", "check", str(rec)]) == 1
    out = capsys.readouterr().out
    assert f"1 of the files record.json lists are missing (first: {gone})" in out


def test_git_ignores_no_file_a_committed_record_lists() -> None:
    """`.gitignore` keeps every file of every record: a listed file git would ignore is
    left out of the commit, and the clone's record is then missing it."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = [(p.parent / f).relative_to(ROOT).as_posix() for p in sorted((ROOT / "records").glob("*/record.json"))
              for f in json.loads(p.read_text())["files"]]
    assert listed
    # exit 0: some path is ignored (printed); 1: none is; the paths need not exist
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(listed),
                       capture_output=True, text=True)
    assert r.returncode == 1 and not r.stdout, f"ignored by .gitignore: {r.stdout.splitlines()[:3]}"
    # the rule itself: a probe record's runs/ and a study record's study/runs/ are kept
    for path in ("records/x/runs/r/config.json", "records/x/study/runs/r/meta.json"):
        r = subprocess.run(["git", "check-ignore", "--no-index", path], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1, path


def test_readme_without_readme_writes_a_skeleton_with_every_block(tmp_path: Path) -> None:
    rec = make_record(tmp_path)
    assert sanlab_main(["record", "readme", str(rec)]) == 0
    text = (rec / "README.md").read_text()
    for name in matched.BLOCKS:
        assert f"<!-- records:BEGIN {name} -->" in text
    assert sanlab_main(["record", "check", str(rec)]) == 0


BAD = {  # case -> what the one-line error must name
    "missing": "no such record dir", "not-a-record": "not a record", "corrupt-spec": "study.json",
    "bad-toml": "record.toml: malformed TOML", "unknown-key": "unknown key 'compare_width'",
    "unknown-block": "block 'nope'", "no-readme": "no README", "corrupt-analysis": "analysis.json",
    "corrupt-floor": "not an entropy-floor file",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_record_dirs_are_one_line_errors(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "rec"
    if case != "missing":
        rec.mkdir()
    if case not in ("missing", "not-a-record"):
        write_study(rec / "study")
        write_marker(rec)
    if case not in ("no-readme", "missing"):
        (rec / "README.md").write_text("<!-- records:BEGIN gaps -->\n<!-- records:END gaps -->\n")
    if case == "corrupt-spec":
        (rec / "study" / "study.json").write_text("{not json")
    if case == "bad-toml":
        (rec / "record.toml").write_text("compare_with = \n")
    if case == "unknown-key":
        (rec / "record.toml").write_text('compare_width = "x"\n')
    if case == "corrupt-analysis":
        (rec / "study" / "analysis" / "final-muon-2000-s1" / "analysis.json").write_text("{trunc")
    if case == "corrupt-floor":
        (rec / "study" / "data" / "entropy_floor.json").write_text("[1, 2]")
    if case == "unknown-block":
        (rec / "README.md").write_text("<!-- records:BEGIN nope -->\n<!-- records:END nope -->\n")
    assert sanlab_main(["record", "check", str(rec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert BAD[case] in err, err


# --------------------------------------------------------------------------- export


def _table_json(study: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert sanlab_main(["study", "table", str(study), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_export_leaves_out_checkpoints_and_shards_and_regenerates_the_tables(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = write_study(tmp_path / "orig" / "study", analysis_root="/somewhere/else/study")
    some_run = next((study / "runs").iterdir())
    (some_run / "checkpoints" / "latest").mkdir(parents=True)
    (some_run / "checkpoints" / "latest" / "model.safetensors").write_bytes(b"\0" * 1000)
    (study / "data" / "train-00000.tokens.bin").write_bytes(b"\0" * 1000)
    (study / "data" / "tokenizer.json").write_text("{}")
    (study / "jobs").mkdir()
    (study / "jobs" / "x.log").write_text("log")
    (study / "report").mkdir()
    (study / "report" / "report.md").write_text("# report")
    rec = tmp_path / "records" / "r"
    export(study, rec, log=lambda s: None)

    out = rec / "study"
    assert not list(out.rglob("checkpoints")) and not list(out.rglob("*.bin")) and not (out / "jobs").exists()
    assert {p.name for p in (out / "data").iterdir()} == {"manifest.json", "entropy_floor.json", "tokenizer.json"}
    assert (rec / "report" / "report.md").read_text() == "# report"
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(p.name for p in (study / "runs").iterdir())
    assert {p.name for p in (out / "runs" / some_run.name).iterdir()} == {"config.json", "meta.json", "metrics.jsonl"}
    a = json.loads(next((out / "analysis").glob("*/analysis.json")).read_text())
    assert all(r["path"] == f"runs/{name}" for name, r in a["runs"].items())
    assert a["sample"] == {"data_dir": "data", "entropy_floor_file": "data/entropy_floor.json"}
    assert (out / "analysis" / "final-muon-2000-s1" / "deltas.csv").is_file()
    # The tables on the copy equal the original's, through the CLI.
    assert _table_json(out, capsys) == _table_json(study, capsys)
    # The README blocks computed from the copy equal those from the original.
    write_marker(tmp_path / "orig")
    original, copied = load(tmp_path / "orig"), load(rec)
    for name, block in matched.BLOCKS.items():
        assert block(copied) == block(original), name
    # `sanlab report` runs on the exported copy.
    assert sanlab_main(["report", str(out), "--out", str(rec / "report")]) == 0
    assert "Gap to the reference" in (rec / "report" / "report.md").read_text()


def test_export_drops_an_absolute_data_dir_and_rewrites_run_configs(tmp_path: Path) -> None:
    study = write_study(tmp_path / "study")
    shared = tmp_path / "shared-data"
    shared.mkdir()
    (shared / "manifest.json").write_text(json.dumps({"exercises": ["text"]}))
    spec = json.loads((study / "study.json").read_text())
    spec["data"]["dir"] = str(shared)
    (study / "study.json").write_text(json.dumps(spec))
    store = study / "results.jsonl"
    store.write_text(store.read_text().replace('"dir": "../../data"', f'"dir": "{shared}"'))
    warnings: list[str] = []
    export(study, tmp_path / "rec", log=warnings.append)
    out = tmp_path / "rec" / "study"
    assert "dir" not in json.loads((out / "study.json").read_text())["data"]
    assert str(shared) not in (out / "results.jsonl").read_text()
    assert json.loads((out / "data" / "manifest.json").read_text()) == {"exercises": ["text"]}
    assert not [w for w in warnings if "absolute path" in w]


def test_export_of_a_non_study_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sanlab_main(["record", "export", str(tmp_path / "nope"), str(tmp_path / "rec")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1


# --------------------------------------------------------------------------- the committed records


# Every committed record (its record.json says which kind); the probe records hold suite.json.
COMMITTED = sorted(p.parent for p in (ROOT / "records").glob("*/record.json")) if (ROOT / "records").is_dir() else []
PROBE_RECORDS = sorted(p.parent for p in (ROOT / "records").glob("*/suite.json")) if (ROOT / "records").is_dir() else []


@pytest.mark.skipif(not PROBE_RECORDS, reason="no committed probe records yet")
@pytest.mark.parametrize("record", PROBE_RECORDS, ids=[p.name for p in PROBE_RECORDS])
def test_committed_probe_record_readme_table_equals_its_suite_json(record: Path) -> None:
    """The README's measured grid (first table) is suite.json's table, cell by cell."""
    res = json.loads((record / "suite.json").read_text())
    lines = (record / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| arm |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    labels = {a["name"]: a["label"] for a in res["arms"]}
    assert set(rows) == set(labels.values())
    edge = {(c["arm"], c["key"].split("/")[0]) for c in res["cells"] if c["at_edge"]}

    def fano(k: int, n: int, a_: int) -> float:  # Fano's bound in bits, 0 at or below chance
        a = k / n
        if a <= 1 / a_:
            return 0.0
        h2 = 0.0 if a == 1 else -(a * math.log2(a) + (1 - a) * math.log2(1 - a))
        return n * (math.log2(a_) - h2 - (1 - a) * math.log2(a_ - 1))

    def capacity_text(name: str, reading: str) -> str:
        cap = res["capacity"][name]
        pts, a_ = cap["points"], cap["alphabet"]
        score = (lambda p: p["memorised"] * math.log2(a_)) if reading == "count" else (
            lambda p: fano(p["memorised"], p["n"], a_))
        best = max(pts, key=score)  # the first maximum, as the suite takes it
        bracketed = best["memorised"] < best["n"] and any(p["n"] > best["n"] for p in pts)
        text = f"{score(best) / cap['params']:.2f} (N={best['n']})" + ("" if bracketed else "†")
        return text + ("*" if (name, f"capacity-n{best['n']}") in edge else "")

    for name, label in labels.items():
        columns = [c for t in res["tasks"] for c in ((t, "fano") if t == "capacity" else (t,))]
        for col, text in zip(columns, rows[label], strict=True):
            if col in ("capacity", "fano"):
                if col == "capacity":
                    assert f"{res['table'][name]['capacity']:.2f}" == capacity_text(name, "count").split()[0]
                assert text == capacity_text(name, "count" if col == "capacity" else "fano"), (label, col)
                continue
            assert text == f"{res['table'][name][col]:.1f}" + ("*" if (name, col) in edge else ""), (label, col)


@pytest.mark.skipif(not COMMITTED, reason="no committed records/*/README.md yet")
@pytest.mark.parametrize("record", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_record_readme_equals_its_results(record: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README tables of every committed record equal what its committed study gives."""
    code = sanlab_main(["record", "check", str(record)])
    assert code == 0, capsys.readouterr().out


def test_a_records_floor_keeps_two_significant_digits_where_four_decimals_show_zero() -> None:
    """A record made on a deterministic CPU in fp32 has a floor of ~3e-5: its claims say
    F = 3.0e-05, not F = 0.0000 (the rule of the gap table, `sanlab.study.noise.nats`)."""
    from sanlab.records.common import fmt_floor

    assert fmt_floor(3e-5) == "3.0e-05" and fmt_floor(0.0035) == "0.0035" and fmt_floor(0.0) == "0.0000"
    assert fmt_floor(None) == "–" and fmt_floor(math.nan) == "–"
    rec = type("Rec", (), {"floor_size": 2.6e-5})()
    assert matched._floor_text(rec) == "F = 2.6e-05"  # type: ignore[arg-type]
