"""`sanlab report STUDY --analyze --milestones` on a tiny really trained study: each final
pair group is analysed (losses only) at every milestone checkpoint its runs share but 0%
and 100%, into STUDY/analysis/GROUP/milestones/milestone-NNN/; the losses there are what
`sanlab analyze --checkpoint milestone-NNN` gives; the final analysis and every reader of
`analysis/*/analysis.json` are untouched; a rerun keeps what is there; the record copy
carries them with portable paths."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.analysis.output import load_milestone_analyses
from sanlab.cli import main
from sanlab.errors import DataError
from sanlab.records.study import load_study
from sanlab.records.studycopy import copy_study
from sanlab.report import data as report_data
from sanlab.report.cli import make_report
from sanlab.study.orchestrate import Study
from sanlab.study.spec import StudySpec

ROWS = "8"  # held-out rows per analysis (the final's and the milestones' alike)
GROUP = "final-muon-1024-s1"


@pytest.fixture(scope="module")
def study(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAN vs iso-param, one seed, one budget, milestones at 0, 25, 50 and 100%; reported
    with --analyze --milestones (~20 s on one core)."""
    spec = StudySpec.model_validate({
        "name": "milestones", "seeds": [1], "data": {"dir": str(study_data_dir), "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "train": {"batch_rows": 4, "eval_every": 0, "eval_rows": 4, "milestones": [0.0, 0.25, 0.5, 1.0],
                  "precision": "fp32"},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "sweep": {"enabled": False}, "noise": {"enabled": False}, "final": {"tokens": [1024]},
        "runner": {"workers": 1, "threads": 1},
    })
    out = tmp_path_factory.mktemp("milestones") / "study"
    assert Study(spec, out, console=Console(file=open(os.devnull, "w"))).run() == 0
    assert main(["report", str(out), "--analyze", "--milestones", "--eval-rows", ROWS]) == 0
    return out


def _runs(study: Path) -> list[Path]:
    return sorted((study / "runs").iterdir())


def test_each_shared_milestone_but_0_and_100_is_analysed_apart_from_the_final(study: Path) -> None:
    group = study / "analysis" / GROUP
    assert sorted(p.name for p in (group / "milestones").iterdir()) == ["milestone-025", "milestone-050"]
    final = json.loads((group / "analysis.json").read_text())
    assert final["checkpoint"] == "latest" and "spectra" in final["sections"]
    ids = {p.name for p in _runs(study)}
    for pct in (25, 50):
        a = json.loads((group / "milestones" / f"milestone-{pct:03d}" / "analysis.json").read_text())
        assert a["checkpoint"] == f"milestone-{pct:03d}" and a["sections"] == ["losses"]
        assert set(a["runs"]) == ids and [(c["run"], c["vs"]) for c in a["comparisons"]] == [
            (next(i for i in ids if i.startswith("iso_param")), next(i for i in ids if i.startswith("san")))]
    # Every reader of the final analyses sees the final ones only.
    finals = report_data.load_analyses(study)
    assert [Path(a["_path"]).parent.name for a in finals] == [GROUP] and finals[0]["checkpoint"] == "latest"
    assert report_data.load(study).analysis_runs() == final["runs"]
    assert report_data.missing_analyses(report_data.load(study)) == []


def test_a_milestones_losses_are_what_analyze_gives_at_that_checkpoint(study: Path, tmp_path: Path) -> None:
    by_pct = load_milestone_analyses(study / "analysis")[GROUP]
    assert sorted(by_pct) == [25, 50]
    final = json.loads((study / "analysis" / GROUP / "analysis.json").read_text())
    for pct in (25, 50):
        a = by_pct[pct]
        assert a["_path"] == str(study / "analysis" / GROUP / "milestones" / f"milestone-{pct:03d}" / "analysis.json")
        for run in _runs(study):
            out = tmp_path / f"{run.name}-{pct}"
            assert main(["analyze", str(run), "--checkpoint", str(pct), "--skip", "attention,stream,spectra",
                         "--eval-rows", ROWS, "--out", str(out)]) == 0
            direct = json.loads((out / "analysis.json").read_text())["runs"][run.name]["losses"]
            got = a["runs"][run.name]["losses"]
            assert got["loss"] == direct["loss"]
            by_type = {r["group"]: r["loss"] for r in got["exercise"]}
            assert by_type == {r["group"]: r["loss"] for r in direct["exercise"]}
            assert got["loss"] != final["runs"][run.name]["losses"]["loss"]  # not the final weights
        (c,) = a["comparisons"]
        ident = c["exercise"]["identity"]["aggregate_delta"]
        assert ident == pytest.approx(a["runs"][c["run"]]["losses"]["loss"] - a["runs"][c["vs"]]["losses"]["loss"])
    # Earlier in training the loss is higher (1024 tokens: the curve still falls steeply).
    for run in _runs(study):
        assert by_pct[25]["runs"][run.name]["losses"]["loss"] > final["runs"][run.name]["losses"]["loss"]


def test_a_rerun_keeps_what_is_there_and_redoes_only_what_is_missing(study: Path, tmp_path: Path) -> None:
    d = tmp_path / "study"
    shutil.copytree(study, d)
    ms = d / "analysis" / GROUP / "milestones"
    kept = (ms / "milestone-025" / "analysis.json").read_bytes()
    shutil.rmtree(ms / "milestone-050")
    data = report_data.load(d)
    assert [(g.out_name, p) for g, p in report_data.missing_milestone_analyses(data)] == [(GROUP, 50)]
    logs: list[str] = []
    make_report(d, analyze=True, milestones=True, eval_rows=int(ROWS), log=logs.append)
    assert (ms / "milestone-025" / "analysis.json").read_bytes() == kept
    assert sum("milestone 50%" in ln for ln in logs) == 1 and not any("milestone 25%" in ln for ln in logs)
    redone = json.loads((ms / "milestone-050" / "analysis.json").read_text())
    first = json.loads((study / "analysis" / GROUP / "milestones" / "milestone-050" / "analysis.json").read_text())
    assert {r: v["losses"]["loss"] for r, v in redone["runs"].items()} == {
        r: v["losses"]["loss"] for r, v in first["runs"].items()}
    # A file of another checkpoint in a milestone's dir is not that milestone's analysis: redone.
    other = json.loads(kept)
    other["checkpoint"] = "latest"
    (ms / "milestone-025" / "analysis.json").write_text(json.dumps(other))
    with pytest.raises(DataError, match="not a `sanlab analyze --checkpoint milestone-025` analysis"):
        load_milestone_analyses(d / "analysis")
    assert [p for _, p in report_data.missing_milestone_analyses(report_data.load(d))] == [25]


def test_only_milestones_every_run_of_the_group_has(study: Path, tmp_path: Path) -> None:
    d = tmp_path / "study"
    shutil.copytree(study, d, ignore=shutil.ignore_patterns("analysis"))
    san = next(r for r in (d / "runs").iterdir() if r.name.startswith("san"))
    shutil.rmtree(san / "checkpoints" / "milestone-025")
    data = report_data.load(d)
    (g,) = report_data.final_pair_groups(data)
    assert report_data.group_milestones(data, g) == [50]


def test_the_record_copy_carries_them_with_portable_paths(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "record"
    written = copy_study(study, out, log=lambda s: None)
    copied = load_milestone_analyses(out / "study" / "analysis")
    assert sorted(copied[GROUP]) == [25, 50]
    assert f"study/analysis/{GROUP}/milestones/milestone-050/analysis.json" in written
    for pct, a in copied[GROUP].items():
        assert {r: v["path"] for r, v in a["runs"].items()} == {r.name: f"runs/{r.name}" for r in _runs(study)}
        assert a["sample"]["data_dir"] == "data" and a["sample"]["entropy_floor_file"] == "data/entropy_floor.json"
        orig = load_milestone_analyses(study / "analysis")[GROUP][pct]
        assert a["comparisons"] == orig["comparisons"]
    assert [Path(a["_path"]).parent.name for a in report_data.load_analyses(out / "study")] == [GROUP]
    assert [a["checkpoint"] for a in load_study(out, "matched").analyses] == ["latest"]  # the record's reader


def test_milestones_without_analyze_is_a_usage_error(study: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(study), "--milestones"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1 and "--analyze" in err
