"""The data axis of a study (`data.axis`): the spec, the plan, a run with a stand-in trainer
(tests/study_fakes.py) over two tiny prepared worlds, the tables, a SIGKILL mid-run and its
resume, each value prepared once; and the world's information content in bits."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.config import Config
from sanlab.errors import ConfigError
from sanlab.study.orchestrate import Study, check
from sanlab.study.plan import build_arms, data_points, plan_study
from sanlab.study.results import table_json
from sanlab.study.spec import CorporaAxis, DirsAxis, PrepareAxis, StudySpec
from sanlab.study.store import ResultStore

import study_fakes

TESTS = Path(__file__).parent
FACTS = [64, 128]  # world sizes of the axis: 10 people / 4 cities (76 facts) and 20 / 4 (136 facts)


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes import the stand-in trainer from tests/ and make its loss depend on the world."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SANLAB_FAKE_AXIS", "1")


def raw_spec(**extra: object) -> dict:
    raw: dict = {
        "name": "axis", "seeds": [1, 2], "optimizers": ["muon"],
        "data": {"corpus": "synth", "tokens": 3000, "seq_len": 32, "axis": {"synth.facts": FACTS},
                 "prepare": ["val_frac=0.1"]},
        "model": {"d_model": 32, "n_layers": 5, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "sweep": {"tokens": 1000, "multipliers": [1.0, 4.0], "extend": False},
        "final": {"tokens": [2000]},
        "runner": {"workers": 1, "threads": 1},
    }
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def make_spec(**extra: object) -> StudySpec:
    return StudySpec.model_validate(raw_spec(**extra))


# --------------------------------------------------------------------------- spec and plan


@pytest.mark.parametrize("data, sweep, message", [
    ({"axis": {"synth.facts": [64]}}, {}, "at least 2 values"),
    ({"axis": {"synth.facts": [64, 64]}}, {}, "lists a value twice"),
    ({"axis": {"synth.facts": [64, 128], "seed": [1, 2]}}, {}, "sweeps one key"),
    ({"axis": {"seq_len": [32, 64]}}, {}, "fixed by the models"),
    ({"axis": {"dir": ["a", "b"]}}, {}, "unset data.corpus"),
    ({"prepare": ["synth.facts=64"]}, {}, "which data.axis sweeps"),
    ({}, {"lock_at": 100}, "not one of data.axis.synth.facts"),
])
def test_bad_axis_is_one_line_naming_the_problem(data: dict, sweep: dict, message: str) -> None:
    raw = raw_spec(sweep=sweep)
    raw["data"] = {**raw["data"], **data}
    with pytest.raises(ValueError, match=message):
        StudySpec.model_validate(raw)


def test_lock_at_needs_an_axis_and_a_nested_table_reads_as_the_dotted_key() -> None:
    raw = raw_spec(sweep={"lock_at": 64})
    raw["data"] = {"dir": "x", "seq_len": 32}
    with pytest.raises(ValueError, match="needs a data axis"):
        StudySpec.model_validate(raw)
    import tomllib

    nested = tomllib.loads('[data]\ncorpus = "synth"\ntokens = 10\n[data.axis]\nsynth.facts = [64, 128]\n')
    assert StudySpec.model_validate({**nested, "matching": {"arms": ["iso_param"]}}).data.axis == {
        "synth.facts": [64, 128]}


def test_two_values_with_one_name_are_refused() -> None:
    spec = make_spec(data={"axis": {"dir": ["a/x", "b/x"]}, "corpus": None})
    with pytest.raises(ConfigError, match="both named 'x'"):
        data_points(spec, None)


def test_each_kind_of_axis_names_and_places_its_values(tmp_path: Path) -> None:
    """The typed view of data.axis: a prepare key, corpora or prepared dirs; each value's slug,
    its dir (under the data dir, or the listed dir itself) and the settings that prepare it.
    The saved form stays the dict the spec gave."""
    base = str(tmp_path / "data")
    facts = make_spec(data={"axis": {"synth.facts": [64, 2.5e3]}}).data
    assert isinstance(facts.typed_axis, PrepareAxis)
    assert [(p.slug, p.dir, p.label) for p in facts.typed_axis.points(base)] == [
        ("facts64", f"{base}/facts64", "synth.facts=64"), ("facts2500", f"{base}/facts2500", "synth.facts=2500.0")]
    assert facts.typed_axis.prepare_settings(64, "synth") == ("synth", ["synth.facts=64"])
    assert facts.model_dump()["axis"] == {"synth.facts": [64, 2.5e3]}
    corpora = make_spec(data={"axis": {"corpus": ["synth", "KJV text"]}, "corpus": None}).data
    assert isinstance(corpora.typed_axis, CorporaAxis)
    assert [(p.slug, p.dir) for p in corpora.typed_axis.points(base)] == [
        ("synth", f"{base}/synth"), ("kjv_text", f"{base}/kjv_text")]
    assert corpora.typed_axis.prepare_settings("kjv", None) == ("kjv", [])
    dirs = make_spec(data={"axis": {"dir": ["a/x1", "b/Run 2/"]}, "corpus": None}).data
    assert isinstance(dirs.typed_axis, DirsAxis) and not dirs.typed_axis.prepares
    assert [(p.slug, p.dir) for p in dirs.typed_axis.points(base)] == [("x1", "a/x1"), ("run_2", "b/Run 2/")]
    assert make_spec(data={"axis": {}}).data.typed_axis is None


def test_every_table_gets_the_study_dirs_points(tmp_path: Path) -> None:
    """The points are computed once per study dir, with its dirs, and handed to the tables."""
    spec = make_spec()
    arms, points = check(spec, tmp_path)
    assert [p.dir for p in points] == [str(tmp_path / "data" / s) for s in ("facts64", "facts128")]
    assert points == data_points(spec, tmp_path) and len(arms) == 2


def test_plan_runs_every_arm_sweep_seed_and_noise_pair_at_every_value(tmp_path: Path) -> None:
    spec = make_spec()
    plan = plan_study(spec, tmp_path)
    by_value: dict[str, list] = {}
    for r in plan.runs:
        by_value.setdefault(r.data, []).append(r)
    assert sorted(by_value) == ["facts128", "facts64"]
    for slug, runs in by_value.items():
        # 2 arms × 2 multipliers sweep; 2 arms × 2 seeds final (the SAN's shared with the noise pair); 2 rms runs
        assert len(runs) == 4 + 4 + 2
        assert all(r.run_id.startswith(f"{slug}-") for r in runs)
        assert {r.config.data.dir for r in runs} == {str(tmp_path / "data" / slug)}
        assert {r.data_value for r in runs} == {int(slug[5:])}
    # Locked once: the sweep runs only at 128 facts; every value still has its finals and noise pair.
    locked = plan_study(make_spec(sweep={"lock_at": 128}), tmp_path)
    sweeps = [r for r in locked.runs if "sweep" in r.phases]
    assert len(sweeps) == 4 and {r.data for r in sweeps} == {"facts128"}
    assert len(locked.runs) == 4 + 2 * 6
    assert any("once, at synth.facts=128" in n for n in locked.notes)


# --------------------------------------------------------------------------- a whole study


def _mtimes(study: Path) -> dict[str, int]:
    return {p.name: (p / "manifest.json").stat().st_mtime_ns for p in sorted((study / "data").iterdir())}


def _facts(study: Path, slug: str) -> int:
    return json.loads((study / "data" / slug / "entropy_floor.json").read_text())["world"]["facts"]


def test_axis_study_prepares_each_value_once_and_tables_delta_against_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec()
    study = tmp_path / "study"
    console = Console(record=True, width=250)
    assert Study(spec, study, console=console, train_fn="study_fakes:train").run() == 0
    text = console.export_text()
    assert text.count("preparing synth.facts=") == 2
    prepared = _mtimes(study)
    assert sorted(prepared) == ["facts128", "facts64"]
    facts = {slug: _facts(study, slug) for slug in prepared}
    assert facts == {"facts64": 76, "facts128": 136}  # 10 people × 6 + 4 cities × 4; 20 × 6 + 4 × 4

    store = ResultStore(study)
    records = store.runs()
    arms = build_arms(spec)
    # every run trained on its own value's dir; the store names the value
    for r in records.values():
        assert Path(r["config"]["data"]["dir"]).name == r["data"] and r["run_id"].startswith(r["data"] + "-")
    assert sorted(store.data()) == ["facts128", "facts64"]
    assert {slug: d["world"]["facts"] for slug, d in store.data().items()} == facts

    # Tables: Δ = arm − SAN at each value = the fakes' known difference: the arm's term minus the
    # SAN's 1e-4 per fact; the locks per value (the fake's optimum does not depend on the world).
    t = table_json(study)
    assert t["data"]["key"] == "synth.facts" and t["data"]["values"] == FACTS
    san, iso = arms
    assert [(g["data"], g["data_value"]) for g in t["gaps"]] == [("facts64", 64), ("facts128", 128)]
    for g in t["gaps"]:
        lock = {(lk["arm"], lk["data"]): lk["lr"] for lk in t["locks"]}
        n = facts[g["data"]]
        arm_cfg = Config(model=iso.model, optim={"lr": lock[("iso_param", g["data"])]}, train={"seed": 1})
        ref_cfg = Config(model=san.model, optim={"lr": lock[("san", g["data"])]}, train={"seed": 1})
        want = study_fakes.expected_loss(arm_cfg) - study_fakes.expected_loss(ref_cfg) - 1e-4 * n
        assert g["per_seed"] == {"1": pytest.approx(want), "2": pytest.approx(want)}
        assert g["runs"]["1"]["arm"].startswith(g["data"] + "-iso_param-")
    (axis,) = t["axis"]
    assert [v["data_value"] for v in axis["values"]] == FACTS
    assert axis["values"][1]["mean"] - axis["values"][0]["mean"] == pytest.approx(-1e-4 * (136 - 76))
    assert [n["data"] for n in t["noise_floor"]] == ["facts64", "facts128"]
    assert all(n["mean"] == pytest.approx(0.0015) for n in t["noise_floor"])
    # facts / bits per non-embedding parameter of each arm at each value
    per = {(r["data"], r["arm"]): r for r in t["data"]["per_arm"]}
    for slug, n in facts.items():
        for a in arms:
            row = per[(slug, a.name)]
            assert row["facts_per_param"] == pytest.approx(n / a.params_non_embedding)
            bits = json.loads((study / "data" / slug / "entropy_floor.json").read_text())["world"]["bits"]
            assert row["bits_per_param"] == pytest.approx(bits / a.params_non_embedding)

    # `study table` in every format carries the axis.
    from sanlab.cli import main

    for fmt in ("text", "md", "csv", "json"):
        capsys.readouterr()
        assert main(["study", "table", str(study), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "synth.facts" in out and "facts/param" in out and "bits/param" in out, fmt
        assert "each value with its own sweep" in out, fmt

    # A rerun prepares nothing and trains nothing again.
    before = (study / "runs" / "calls.txt").read_text().split()
    console2 = Console(record=True, width=250)
    assert Study(spec, study, console=console2, train_fn="study_fakes:train").run() == 0
    assert "preparing" not in console2.export_text() and _mtimes(study) == prepared
    assert (study / "runs" / "calls.txt").read_text().split() == before
    assert len(store.data()) == 2 and sum(r.get("type") == "data" for r in store.records()) == 2


def test_lock_at_sweeps_once_and_says_so_in_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec(sweep={"lock_at": 128})
    study = tmp_path / "study"
    assert Study(spec, study, console=Console(width=250), train_fn="study_fakes:train").run() == 0
    records = ResultStore(study).runs()
    assert {r["data"] for r in records.values() if "sweep" in r["phases"]} == {"facts128"}
    t = table_json(study)
    lock = {(lk["arm"], lk["data"]): lk["lr"] for lk in t["locks"]}
    assert lock[("san", "facts64")] == lock[("san", "facts128")]
    assert len(t["gaps"]) == 2 and all(len(g["per_seed"]) == 2 for g in t["gaps"])
    from sanlab.cli import main

    capsys.readouterr()
    assert main(["study", "table", str(study), "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "locked once at synth.facts=128 and reused at every value" in out
    assert "LR sweep at synth.facts=128" in out and "LR sweep at synth.facts=64" not in out


_RUN = """
import sys
from rich.console import Console
from sanlab.study.orchestrate import Study
from sanlab.study.spec import StudySpec
import json
spec = StudySpec.model_validate(json.loads(sys.argv[1]))
sys.exit(Study(spec, sys.argv[2], console=Console(width=250), train_fn="study_fakes:slow_train").run())
"""


def _study(raw: dict, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _RUN, json.dumps(raw), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_axis_study_killed_mid_run_resumes_without_redoing_or_losing_anything(tmp_path: Path) -> None:
    raw = raw_spec()
    study = tmp_path / "study"
    store = ResultStore(study)
    proc = _study(raw, study)
    deadline = time.time() + 300
    # kill it once some runs of the first value have finished and while one is training
    while sum(r["status"] == "completed" for r in store.runs().values()) < 3:
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {rid: r for rid, r in store.runs().items() if r["status"] == "completed"}
    prepared = _mtimes(study)
    assert done_before and len(done_before) < 20

    rerun = _study(raw, study)
    text = rerun.communicate(timeout=600)[0].decode()
    assert rerun.returncode == 0, text
    runs = store.runs()
    assert len(runs) == 2 * 10 and all(r["status"] == "completed" for r in runs.values())
    records = [r for r in store.records() if r.get("type") == "run"]
    for rid, rec in done_before.items():
        assert sum(r["run_id"] == rid for r in records) == 1  # never run again, its result kept
        assert runs[rid]["final"] == rec["final"]
    calls = (study / "runs" / "calls.txt").read_text().split()
    assert sorted(set(calls)) == sorted(runs)  # every run trained, the finished ones once
    assert all(calls.count(rid) == 1 for rid in done_before)
    assert _mtimes(study) == prepared and "preparing" not in text  # each value prepared once
    assert "synth.facts" in text and "facts/param" in text


# --------------------------------------------------------------------------- bits


def test_world_bits_by_hand(tmp_path: Path) -> None:
    """facts=64: 10 people and 4 cities, 12 countries, 4 rivers. A person's birthplace is one of
    4 cities, profession one of 30, birth year one of 391 (1600–1990), instrument and pet one of
    16, mentor one of the 9 others; a city's country one of 12, river one of 4, founding year
    one of 1001 (800–1800), fame one of 16."""
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare

    person = math.log2(4) + math.log2(30) + math.log2(391) + math.log2(16) + math.log2(16) + math.log2(9)
    city = math.log2(12) + math.log2(4) + math.log2(1001) + math.log2(16)
    bits = 10 * person + 4 * city
    assert bits == pytest.approx(345.0871589818)
    out = tmp_path / "data"
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=2000", "seq_len=32", "vocab_size=320", "val_frac=0.2",
                                                "synth.facts=64"]), out)
    world = json.loads((out / "entropy_floor.json").read_text())["world"]
    assert world["facts"] == 10 * 6 + 4 * 4 == 76
    assert world["bits"] == pytest.approx(bits, rel=1e-12)
    assert world["bits_per_fact"] == pytest.approx(bits / 76, rel=1e-12)
    assert world["attributes"]["mentor"] == {"facts": 10, "values": 9, "bits_per_fact": pytest.approx(math.log2(9))}
    assert world["attributes"]["founded"]["values"] == 1001 and world["attributes"]["founded"]["facts"] == 4
