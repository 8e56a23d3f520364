"""The report's data path (sanlab.report.data) on a study with known numbers: the tables
are the study's own, the final pairs to analyse are those where both runs completed, the
damaged results lines are the store's, and the noise band is the study's floor size F."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sanlab.report import data as report_data
from sanlab.report.plots import _floor_size
from sanlab.study import noise
from sanlab.study.results import table_json
from test_records import NOISE, write_study


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return write_study(tmp_path / "study")


def test_the_report_reads_the_studys_own_tables(study: Path, tmp_path: Path) -> None:
    d = report_data.load(study)
    assert d.tables == json.loads(json.dumps(table_json(study))) and d.tables_error is None
    assert _floor_size(d) == pytest.approx(noise.floor_size(NOISE.values()))  # the grey band is ±F
    # A floor whose mean exceeds its sd: F = |mean| = 0.005 (sd 0.0014).
    shifted = report_data.load(write_study(tmp_path / "shifted", noise={1: 0.004, 2: 0.006}))
    assert _floor_size(shifted) == pytest.approx(0.005)


def test_tables_that_cannot_be_computed_are_one_line(study: Path) -> None:
    spec = json.loads((study / "study.json").read_text())
    spec["matching"]["tolerance"] = 1e-9  # no partner within it
    (study / "study.json").write_text(json.dumps(spec))
    tables, err = report_data.study_tables(study)
    assert tables is None and err is not None and "\n" not in err and "tolerance" in err


def test_final_pairs_need_both_runs_completed(study: Path) -> None:
    store = study / "results.jsonl"
    lines = [json.loads(ln) for ln in store.read_text().splitlines()]
    failed = next(r for r in lines if r["arm"] == "iso_flop" and r["tokens"] == 2000 and r["seed"] == 1)
    failed["status"], failed["final"] = "failed", {}
    store.write_text("".join(json.dumps(r) + "\n" for r in lines))
    groups = {(g.tokens, g.seed): g for g in report_data.final_pair_groups(report_data.load(study))}
    assert sorted(groups) == [(1000, 1), (1000, 2), (2000, 1), (2000, 2)]
    assert [a.split("-")[0] for a in groups[(2000, 1)].arms] == ["iso_param", "iso_depth"]
    assert [a.split("-")[0] for a in groups[(2000, 2)].arms] == ["iso_param", "iso_flop", "iso_depth"]
    assert groups[(2000, 1)].out_name == "final-muon-2000-s1"


def test_the_pairs_still_to_analyse_are_those_no_analysis_covers(study: Path) -> None:
    # write_study analyses the largest budget's pairs only
    missing = report_data.missing_analyses(report_data.load(study))
    assert sorted((g.tokens, g.seed) for g in missing) == [(1000, 1), (1000, 2)]
    # One comparison of a group gone from its analysis: the group is to analyse again.
    path = study / "analysis" / "final-muon-2000-s1" / "analysis.json"
    a = json.loads(path.read_text())
    a["comparisons"] = [c for c in a["comparisons"] if not c["run"].startswith("iso_flop")]
    path.write_text(json.dumps(a))
    missing = report_data.missing_analyses(report_data.load(study))
    assert sorted((g.tokens, g.seed) for g in missing) == [(1000, 1), (1000, 2), (2000, 1)]


def test_damaged_lines_are_the_stores(study: Path) -> None:
    store = study / "results.jsonl"
    lines = store.read_bytes().split(b"\n")
    lines.insert(4, b"\xff\xfe not a record")
    store.write_bytes(b"\n".join(lines))
    d = report_data.load(study)
    assert d.corrupt_lines == [5]
    assert len(d.records) == len(lines) - 2  # every other line is a run (the last is empty)


def test_a_run_is_read_from_the_study_dir_first(study: Path, tmp_path: Path) -> None:
    d = report_data.load(study)
    rid = next(iter(d.records))
    assert d.run_dir(rid) == study / "runs" / rid
    moved = study / "elsewhere" / rid
    (study / "runs" / rid).rename(moved.parent.mkdir() or moved)
    d.records[rid]["run_dir"] = f"elsewhere/{rid}"  # relative: to the study dir
    assert d.run_dir(rid) == moved
