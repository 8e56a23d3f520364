"""`sanlab record export` never deletes or adds a file that is not the record's own.

It writes only into a new or empty dir, or into a record (record.json) of the same kind
whose own folders hold only its own files; anything else is one `sanlab: error:` line,
exit 2, with every file under the test's world unchanged (a listing with hashes before
and after). A failure part-way (a full disk) leaves the destination as it was. Commands
run as a user types them: from a working dir, with relative paths."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

from sanlab.cli import main
import sanlab.records.export as export_mod
import sanlab.records.studycopy as studycopy
from sanlab.records import kinds, marker
from sanlab.records.kinds import KINDS
from test_records import write_study


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with a hash of its content (directories as 'dir')."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working dir holding a finished study (`study/`) and the things export must not touch."""
    monkeypatch.chdir(tmp_path)
    write_study(tmp_path / "study")
    (tmp_path / "study" / "report").mkdir()
    (tmp_path / "study" / "report" / "report.md").write_text("# the study's report\n")
    mine = tmp_path / "mine"  # a user's dir that happens to have record-like folders
    (mine / "study").mkdir(parents=True)
    (mine / "study" / "mine.txt").write_text("a user's notes\n")
    (mine / "report").mkdir()
    (mine / "report" / "fig.png").write_bytes(b"\x89PNG a user's figure")
    run = tmp_path / "run"  # a training run dir
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "meta.json").write_text('{"status": "completed"}')
    (tmp_path / "file.txt").write_text("a file\n")
    (tmp_path / "otherstudy").mkdir()
    (tmp_path / "otherstudy" / "study.json").write_text("{}")
    probe = tmp_path / "probes-record"  # a record of another kind
    probe.mkdir()
    (probe / "suite.json").write_text(json.dumps({"arms": [{"name": "standard", "label": "Standard"}],
                                                  "tasks": [], "table": {"standard": {}}}))
    (probe / "record.json").write_text(marker.text("probes", ["suite.json"]))
    return tmp_path


REFUSED = {  # case -> (RECORD_DIR, what the error line must say)
    "a dir with a user's study/ and report/": ("mine", "is not empty and not a record"),
    "the study itself": ("study", "is the source itself"),
    "a dir inside the study": ("study/rec", "is inside the source"),
    "a dir holding the study": (".", "holds the source"),
    "a training run dir": ("run", "is a training run dir"),
    "a path under a file": ("file.txt/sub", "file.txt is a file, not a directory"),
    "a file": ("file.txt", "exists and is not a directory"),
    "another study dir": ("otherstudy", "is a study dir"),
    "a record of another kind": ("probes-record", "is a probes record"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_export_refuses_a_destination_that_is_not_its_own(case: str, world: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    dst, needle = REFUSED[case]
    before = snapshot(world)
    assert main(["record", "export", "study", dst]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sanlab: error: ") and needle in err[0], err
    assert snapshot(world) == before


def test_export_refuses_a_record_holding_a_file_that_is_not_its_own(world: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "export", "study", "rec"]) == 0
    (world / "rec" / "study" / "notes.txt").write_text("a user's notes inside the record's study/\n")
    capsys.readouterr()
    before = snapshot(world)
    assert main(["record", "export", "study", "rec"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "study/notes.txt is not one of the record's own files" in err[0], err
    assert snapshot(world) == before


@pytest.mark.parametrize("source, needle", [("nowhere", "no such directory"),
                                            ("mine", "is not a study dir (no study.json) nor a probe suite")])
def test_export_of_something_that_is_not_a_source(source: str, needle: str, world: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(world)
    assert main(["record", "export", source, "new"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert snapshot(world) == before


def test_export_into_a_new_or_empty_dir_writes_the_record_and_its_marker(world: Path) -> None:
    assert main(["record", "export", "study", "records/a/new"]) == 0  # parents made
    (world / "empty").mkdir()
    assert main(["record", "export", "study", "empty"]) == 0
    for rec in (world / "records" / "a" / "new", world / "empty"):
        m = marker.read(rec, KINDS)
        on_disk = sorted(p.relative_to(rec).as_posix() for p in rec.rglob("*") if p.is_file())
        assert m["kind"] == "matched" and sorted([*m["files"], "record.json"]) == on_disk
        assert (rec / "report" / "report.md").read_text() == "# the study's report\n"
    assert not [p for p in world.rglob(".*export*")]  # no staging dir left behind


def test_reexport_replaces_only_the_records_own_files(world: Path) -> None:
    assert main(["record", "export", "study", "rec"]) == 0
    rec = world / "rec"
    (rec / "README.md").write_text("# hand-written\n")
    (rec / "record.toml").write_text('prediction = "written before"\n')
    (rec / "spec.toml").write_text("name = 'x'\n")
    # The study moves on: its report is gone and one of its analysis files too.
    (world / "study" / "report" / "report.md").unlink()
    (world / "study" / "report").rmdir()
    gone = world / "study" / "analysis" / "final-muon-2000-s2"
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    assert main(["record", "export", "study", "rec"]) == 0
    assert (rec / "README.md").read_text() == "# hand-written\n"
    assert (rec / "record.toml").read_text() == 'prediction = "written before"\n'
    assert (rec / "spec.toml").is_file()
    assert not (rec / "report").exists() and not (rec / "study" / "analysis" / "final-muon-2000-s2").exists()
    files = marker.read(rec, KINDS)["files"]
    assert not [f for f in files if f.startswith("report/") or "final-muon-2000-s2" in f]
    assert sorted(files) == sorted(p.relative_to(rec).as_posix() for p in (rec / "study").rglob("*") if p.is_file())


def test_a_full_disk_part_way_leaves_the_destination_as_it_was(world: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "export", "study", "rec"]) == 0
    (world / "rec" / "README.md").write_text("# hand-written\n")
    real, calls = studycopy.copy_file, []

    def fill_up(src: Path, dst: Path) -> None:
        calls.append(src)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(studycopy, "copy_file", fill_up)
    capsys.readouterr()
    for dst in ("rec", "brand/new"):  # over an existing record, and into a new dir
        before = snapshot(world)
        assert main(["record", "export", "study", dst]) == 5
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("sanlab: error: no space left"), err
        assert snapshot(world) == before
        calls.clear()


def test_a_failed_swap_puts_the_old_record_back(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["record", "export", "study", "rec"]) == 0
    (world / "rec" / "README.md").write_text("# hand-written\n")
    before = snapshot(world)
    real = os.replace

    def fail_on_marker(src: object, dst: object) -> None:
        if Path(str(dst)).name == "record.json":
            raise OSError(errno.EIO, "I/O error", str(dst))
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(export_mod.os, "replace", fail_on_marker)
    with pytest.raises(OSError):
        export_mod.export("study", "rec", log=lambda s: None)
    monkeypatch.setattr(export_mod.os, "replace", real)
    assert snapshot(world) == before


def test_a_study_on_an_existing_data_dir_exports(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study that trained on a prepared dir (`data.dir`, no `data.corpus`) keeps a valid
    spec in the record: its data.dir becomes its own `data/`."""
    shared = world / "prepared"
    shared.mkdir()
    (shared / "manifest.json").write_text(json.dumps({"exercises": ["memorization", "rag", "math"]}))
    spec = json.loads((world / "study" / "study.json").read_text())
    spec["data"] = {"dir": "prepared", "seq_len": spec["data"]["seq_len"]}
    (world / "study" / "study.json").write_text(json.dumps(spec))
    assert main(["record", "export", "study", "rec"]) == 0
    out = world / "rec" / "study"
    assert json.loads((out / "study.json").read_text())["data"] == {"dir": "data", "seq_len": spec["data"]["seq_len"]}
    assert json.loads((out / "data" / "manifest.json").read_text())["exercises"] == ["memorization", "rag", "math"]
    capsys.readouterr()
    assert main(["study", "table", str(out), "--json"]) == 0
    copied = json.loads(capsys.readouterr().out)
    assert main(["study", "table", "study", "--json"]) == 0
    assert copied == json.loads(capsys.readouterr().out)
    (world / "rec" / "README.md").write_text("<!-- records:BEGIN claims -->\n<!-- records:END claims -->\n")
    assert main(["record", "readme", "rec"]) == 0
    assert "**reproduced**" in (world / "rec" / "README.md").read_text()


def test_a_probe_suite_exports_as_a_probes_record(world: Path) -> None:
    suite = world / "runs" / "probes"
    suite.mkdir(parents=True)
    (suite / "suite.json").write_text(json.dumps({"arms": [{"name": "standard", "label": "Standard"}],
                                                  "tasks": ["retrieval"], "table": {"standard": {"retrieval": 50.0}},
                                                  "cells": []}))
    (suite / "suite.csv").write_text("arm,task\n")
    (suite / "runs").mkdir()  # the suite's run dirs stay behind
    assert main(["record", "export", "runs/probes", "records/p"]) == 0
    rec = world / "records" / "p"
    assert sorted(p.name for p in rec.iterdir()) == ["record.json", "suite.csv", "suite.json"]
    assert marker.read(rec, KINDS)["kind"] == "probes"
    assert main(["record", "readme", "records/p"]) == 0
    assert "<!-- records:BEGIN claims -->" in (rec / "README.md").read_text()


def test_a_probe_export_refuses_a_copy_whose_blocks_differ(world: Path, monkeypatch, capsys) -> None:
    """The copy is checked block by block: an ablation file left behind changes the
    ablations block, and the export fails in one line, writing nothing."""
    suite = world / "runs" / "probes"
    suite.mkdir(parents=True)
    arm = {"name": "mixit", "label": "MixiT", "overrides": ["model.mixer=mixit"]}
    row = {"name": "mixit_row", "label": "mixit_row", "overrides": ["model.mixer=mixit", "x=row"]}
    cell = {"key": "addition/mixit", "task": "addition", "arm": "mixit", "test_correct": 9, "test_total": 10}
    (suite / "suite.json").write_text(json.dumps({"arms": [arm], "tasks": ["addition"],
                                                  "table": {"mixit": {"addition": 90.0}}, "cells": [cell]}))
    (suite / "probe-addition.json").write_text(json.dumps({"arms": [arm, row], "cells": [
        cell, {**cell, "key": "addition/mixit_row", "arm": "mixit_row", "test_correct": 2}]}))
    drop = kinds._probe_files
    monkeypatch.setattr(kinds, "_probe_files", lambda src: [f for f in drop(src) if not f.startswith("probe-")])
    assert main(["record", "export", "runs/probes", "records/p"]) != 0
    err = capsys.readouterr().err
    assert "the ablations block differs" in err and len(err.strip().splitlines()) == 1
    assert not (world / "records" / "p").exists()
    monkeypatch.setattr(kinds, "_probe_files", drop)
    assert main(["record", "export", "runs/probes", "records/p"]) == 0


def test_a_probe_record_keeps_each_sweep_points_config_meta_and_accuracies(world: Path, capsys) -> None:
    """The run files a record keeps are exactly each named point's config, meta and probe.json
    (not its checkpoints or metrics), so that a suite rerun into a copy reuses them."""
    suite = world / "runs" / "probes"
    points = {"retrieval/standard": ["runs/r-std-a", "runs/r-std-b"], "retrieval/san": ["runs/r-san-a"]}
    for dirs in points.values():
        for d in dirs:
            run = suite / d
            (run / "ckpt").mkdir(parents=True)
            for name in ("config.json", "meta.json", "probe.json"):
                (run / name).write_text(json.dumps({"name": name, "run": d}))
            (run / "metrics.jsonl").write_text("{}\n")
            (run / "ckpt" / "model.safetensors").write_bytes(b"x")
    (suite / "runs" / "r-unnamed").mkdir()  # a run no results file names is not kept
    (suite / "runs" / "r-unnamed" / "config.json").write_text("{}")
    cells = [{"key": k, "task": "retrieval", "arm": k.split("/")[1], "points": [{"run_dir": d} for d in dirs]}
             for k, dirs in points.items()]
    doc = {"arms": [{"name": "standard", "label": "Standard"}, {"name": "san", "label": "SAN"}],
           "tasks": ["retrieval"], "table": {"standard": {"retrieval": 50.0}}, "cells": cells}
    (suite / "suite.json").write_text(json.dumps(doc))
    assert main(["record", "export", "runs/probes", "records/p"]) == 0
    rec = world / "records" / "p"
    kept = sorted(str(p.relative_to(rec)) for p in (rec / "runs").rglob("*") if p.is_file())
    assert kept == sorted(f"{d}/{n}" for dirs in points.values() for d in dirs
                          for n in ("config.json", "meta.json", "probe.json"))
    assert json.loads((rec / "runs" / "r-san-a" / "probe.json").read_text()) == {"name": "probe.json",
                                                                                 "run": "runs/r-san-a"}
    listed = marker.read(rec, KINDS)["files"]
    assert "runs/r-std-b/meta.json" in listed and "suite.json" in listed
    assert "every README block reads the same from the copy" in capsys.readouterr().out
    assert main(["record", "readme", "records/p"]) == 0 and main(["record", "check", "records/p"]) == 0
    # A point whose run dir escapes the suite's runs/ is refused, in one line.
    cells[0]["points"][0]["run_dir"] = "../elsewhere/r1"
    (suite / "suite.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["record", "export", "runs/probes", "records/q"]) != 0
    err = capsys.readouterr().err
    assert "is not runs/RUN_ID" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (world / "records" / "q").exists()
