"""A results store with a damaged line (bytes that are not UTF-8, a line that is not a JSON
record) is read by every command the way a torn last line is: the line is skipped and
named, the answer is the one the intact lines give, and `study run` moves the line to
results.jsonl.torn (its bytes kept) and goes on without retraining anything."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from sanlab.cli import main
from sanlab.records.export import export
from sanlab.study.orchestrate import Study, load_saved_spec
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore

TESTS = Path(__file__).parent
BAD = b'{"type": "run", "run_id": "x\xff\xfe", "status": "completed"}'  # invalid UTF-8 inside


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def finished(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), old])
    try:
        spec = StudySpec.model_validate({
            "name": "damaged", "seeds": [1, 2], "data": {"dir": str(study_data_dir), "seq_len": 32},
            "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
            "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
            "sweep": {"tokens": 1000, "multipliers": [1, 2], "extend": False}, "final": {"tokens": [1000]},
            "runner": {"workers": 2, "threads": 1},
        })
        out = tmp_path_factory.mktemp("finished") / "study"
        assert Study(spec, out, console=Console(file=open(os.devnull, "w")), train_fn="study_fakes:train").run() == 0
    finally:
        os.environ["PYTHONPATH"] = old
    return out


def _damaged_copy(src: Path, dst: Path, *, replace_line: int | None = None) -> bytes:
    """A copy of the study whose store holds BAD: inserted as line 3, or in place of a record."""
    shutil.copytree(src, dst)
    lines = (dst / "results.jsonl").read_bytes().split(b"\n")[:-1]
    if replace_line is None:
        lines.insert(2, BAD)
    else:
        lines[replace_line - 1] = lines[replace_line - 1][:20] + b"\xff" + lines[replace_line - 1][21:]
    (dst / "results.jsonl").write_bytes(b"".join(ln + b"\n" for ln in lines))
    return lines[2] if replace_line is None else lines[replace_line - 1]


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict, list[str]]:
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err.splitlines()


def test_the_store_skips_and_names_a_damaged_line(finished: Path, tmp_path: Path) -> None:
    _damaged_copy(finished, tmp_path / "s")
    store = ResultStore(tmp_path / "s")
    assert store.damaged() == [3]
    assert store.runs() == ResultStore(finished).runs()


def test_status_and_table_answer_as_without_the_line(finished: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "s"
    _damaged_copy(finished, study)
    status, err = _json(["study", "status", str(study), "--json"], capsys)
    clean, _ = _json(["study", "status", str(finished), "--json"], capsys)
    assert status["runs"] == clean["runs"] and status["counts"] == clean["counts"]
    assert err == [f"note: {study / 'results.jsonl'}: 1 damaged line(s) skipped (line 3); "
                   "`sanlab study run` moves them to results.jsonl.torn"]
    table, err = _json(["study", "table", str(study), "--json"], capsys)
    assert table == _json(["study", "table", str(finished), "--json"], capsys)[0] and len(err) == 1
    capsys.readouterr()
    assert main(["study", "table", str(study)]) == 0
    assert "Gap to the reference" in capsys.readouterr().out


def test_report_is_written_and_the_line_named(finished: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "s"
    _damaged_copy(finished, study)
    capsys.readouterr()
    assert main(["report", str(study)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "corrupt line(s) 3 skipped; the report was written without them" in err[0]
    assert "1 corrupt line(s) skipped (line 3)" in (study / "report" / "report.md").read_text()


@pytest.mark.parametrize("how", ["inserted", "inside a record"])
def test_study_run_moves_the_line_aside_and_retrains_nothing(finished: Path, tmp_path: Path, how: str) -> None:
    study = tmp_path / "s"
    bad = _damaged_copy(finished, study, replace_line=None if how == "inserted" else 2)
    calls = sum(len(p.read_text().splitlines()) for p in study.glob("runs/calls.txt"))
    spec = load_saved_spec(study)
    assert Study(spec, study, console=Console(file=open(os.devnull, "w")), train_fn="study_fakes:train").run() == 0
    assert (study / "results.jsonl.torn").read_bytes() == bad + b"\n"
    store = ResultStore(study)
    assert store.damaged() == []
    assert {k: v["status"] for k, v in store.runs().items()} == {k: v["status"] for k, v in
                                                                ResultStore(finished).runs().items()}
    assert sum(len(p.read_text().splitlines()) for p in study.glob("runs/calls.txt")) == calls


def test_a_record_with_a_damaged_line_is_refused_not_regenerated(finished: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A record is never read from damaged results: check says so (exit 2) and changes nothing."""
    rec = tmp_path / "rec"
    export(finished, rec, log=lambda s: None)
    (rec / "README.md").write_text("<!-- records:BEGIN gaps -->\n<!-- records:END gaps -->\n")
    assert main(["record", "readme", str(rec)]) == 0
    store = rec / "study" / "results.jsonl"
    store.write_bytes(store.read_bytes() + BAD + b"\n")
    capsys.readouterr()
    readme = (rec / "README.md").read_bytes()
    assert main(["record", "check", str(rec)]) == 2
    err = capsys.readouterr().err
    assert "the record's results are damaged (line 12" in err and "record readme" not in err
    assert main(["record", "readme", str(rec)]) == 2
    assert (rec / "README.md").read_bytes() == readme
