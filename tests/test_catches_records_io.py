"""What a record's copy of its study holds, value by value (bugs an audit planted in
`sanlab.records.studycopy` and `sanlab.records.marker` that the rest of the suite let
through).

- copy_study: an analysis path is made `runs/RUN_ID` only for a run of the study (another
  path stays as given); on a data axis each analysis sample reads its own point's
  `data/SLUG`; speed.json and the report's sub-folders are copied as they are; a JSON
  file of the copy that still holds an absolute path is warned about, naming both.
- marker.read: a listed file with a backslash, or the marker itself, is refused; so is a
  marker without its version, or a sha256 that is more than a 64-digit lowercase hex digest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sanlab.records import marker
from sanlab.records.common import RecordError
from sanlab.records.studycopy import copy_study
from test_records import write_study


def _analysis(study: Path) -> Path:
    return next((study / "analysis").glob("*/analysis.json"))


def _copy(study: Path, out: Path) -> tuple[list[str], list[str]]:
    warnings: list[str] = []
    return copy_study(study, out, warnings.append), warnings


def test_only_the_studys_own_runs_become_relative_in_its_analyses(tmp_path: Path) -> None:
    study = write_study(tmp_path / "study")
    path = _analysis(study)
    a = json.loads(path.read_text())
    mine = next(iter(a["runs"]))
    a["runs"]["elsewhere"] = {**a["runs"][mine], "path": "../other-study/runs/not-this-studys"}
    path.write_text(json.dumps(a))
    _copy(study, tmp_path / "rec")
    b = json.loads((tmp_path / "rec" / "study" / path.relative_to(study)).read_text())
    assert b["runs"][mine]["path"] == f"runs/{mine}"
    assert b["runs"]["elsewhere"]["path"] == "../other-study/runs/not-this-studys"


def test_on_a_data_axis_each_analysis_reads_its_own_points_data(tmp_path: Path) -> None:
    """A point prepared outside the study dir (a `data.axis.dir` entry, or a data.dir
    elsewhere) has an absolute `dir` in its data record: its files are copied from there.
    (Export used to look for them where the copy holds them, study/data/SLUG, and left
    them out with a warning naming that wrong place.)"""
    study = write_study(tmp_path / "study")
    shared = tmp_path / "prepared-big"  # a point prepared outside the study dir
    for where in (study / "data" / "small", shared):
        where.mkdir(parents=True)
        (where / "manifest.json").write_text(json.dumps({"exercises": [where.name]}))
        (where / "entropy_floor.json").write_text("{}")
    with (study / "results.jsonl").open("a") as f:
        f.write(json.dumps({"type": "data", "data": "small", "dir": "data/small"}) + "\n")
        f.write(json.dumps({"type": "data", "data": "big", "dir": str(shared)}) + "\n")
    path = _analysis(study)
    a = json.loads(path.read_text())
    a["sample"] = {"data_dir": "/scratch/somewhere/big", "entropy_floor_file": "/scratch/somewhere/big/entropy_floor.json"}
    path.write_text(json.dumps(a))
    written, _ = _copy(study, tmp_path / "rec")
    out = tmp_path / "rec" / "study"
    assert json.loads((out / path.relative_to(study)).read_text())["sample"] == {
        "data_dir": "data/big", "entropy_floor_file": "data/big/entropy_floor.json"}
    assert json.loads((out / "data" / "big" / "manifest.json").read_text()) == {"exercises": ["prepared-big"]}
    assert json.loads((out / "data" / "small" / "manifest.json").read_text()) == {"exercises": ["small"]}
    assert {"study/data/big/manifest.json", "study/data/small/manifest.json"} <= set(written)


def test_speed_and_the_reports_folders_are_copied_as_they_are(tmp_path: Path) -> None:
    study = write_study(tmp_path / "study")
    (study / "speed.json").write_text(json.dumps({"arms": {"san": {"tokens_per_s": 1234.5}}}))
    (study / "report" / "figures").mkdir(parents=True)
    (study / "report" / "report.md").write_text("# report\n")
    (study / "report" / "figures" / "report.md").write_text("a figure's notes\n")
    written, _ = _copy(study, tmp_path / "rec")
    rec = tmp_path / "rec"
    assert (rec / "study" / "speed.json").read_text() == (study / "speed.json").read_text()
    assert (rec / "report" / "report.md").read_text() == "# report\n"
    assert (rec / "report" / "figures" / "report.md").read_text() == "a figure's notes\n"
    assert {"study/speed.json", "report/report.md", "report/figures/report.md"} <= set(written)


def test_an_absolute_path_left_in_the_copy_is_warned_about(tmp_path: Path) -> None:
    study = write_study(tmp_path / "study")
    run = sorted((study / "runs").iterdir())[0]
    (run / "meta.json").write_text(json.dumps({"status": "completed", "host": {"cwd": "/home/someone/work"}}))
    _, warnings = _copy(study, tmp_path / "rec")
    assert warnings == [f"warning: study/runs/{run.name}/meta.json holds an absolute path: /home/someone/work"]


# --------------------------------------------------------------------------- record.json


@pytest.mark.parametrize("listed", ["study\\results.jsonl", "record.json", "record.json/x"])
def test_a_marker_listing_a_backslash_path_or_itself_is_refused(tmp_path: Path, listed: str) -> None:
    """A listed file is the export's own: a Windows-style path names no file of the record
    (on POSIX it is one odd name), and the marker itself is never one of its own files (a
    re-export would replace it as one)."""
    (tmp_path / "record.json").write_text(marker.text("matched", ["study/study.json"]))
    assert marker.read(tmp_path, ("matched",))["files"] == ["study/study.json"]
    (tmp_path / "record.json").write_text(marker.text("matched", ["study/study.json", listed]))
    with pytest.raises(RecordError, match=r'"files"\[\d\] \(.*\) is not a relative path of a file inside the record'):
        marker.read(tmp_path, ("matched",))


def test_a_marker_needs_its_version_and_whole_sha256_digests(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    good = json.loads(marker.text("matched", ["study/study.json"], {"study/study.json": "a" * 64}))
    path.write_text(json.dumps(good))
    assert marker.read(tmp_path, ("matched",))["sha256"] == {"study/study.json": "a" * 64}
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "version"}))
    with pytest.raises(RecordError, match="record format version None; this sanlab reads 1"):
        marker.read(tmp_path, ("matched",))
    for digest in ("a" * 66, "a" * 64 + "\n", "A" * 64):
        path.write_text(json.dumps({**good, "sha256": {"study/study.json": digest}}))
        with pytest.raises(RecordError, match="is not a SHA-256 hex digest"):
            marker.read(tmp_path, ("matched",))
