"""The one rendering layer (`sanlab.tables`): every table-printing command, written to a
non-terminal stream at 80 columns, prints every cell whole on one line (nothing cut with
'…', nothing wrapped); COLUMNS is honoured; md, csv and json carry the same cells."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from analysis_rundirs import write_run
from sanlab.cli import main
from sanlab.config import ModelConfig
from sanlab.tables import Output, Table

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).parent


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Table]:
    """Every Table any command hands to an Output, in order (they are printed as usual)."""
    seen: list[Table] = []
    real = Output.table

    def table(self: Output, t: Table) -> None:
        seen.append(t)
        real(self, t)

    monkeypatch.setattr(Output, "table", table)
    monkeypatch.setenv("COLUMNS", "80")
    return seen


def assert_whole(out: str, tables: list[Table]) -> None:
    """Each table's title and each row's cells on one line of `out`, in order, whole."""
    assert tables, "no table was printed"
    assert "…" not in out, [ln for ln in out.splitlines() if "…" in ln][:3]
    lines = out.splitlines()
    for t in tables:
        assert t.title in lines, f"title not on a line of its own: {t.title!r}"
        if not any("\n" in c.name for c in t.columns):
            header = [c.name for c in t.columns if c.name]
            assert any(_in_order(ln, header) for ln in lines), f"{t.title}: header {header} not on one line"
        for part in (p for c in t.columns for p in c.name.split("\n")):
            assert any(part in ln for ln in lines), f"{t.title}: header {part!r} cut"
        for row in t.rows:
            assert any(_in_order(ln, [c for c in row if c]) for ln in lines), \
                f"{t.title}: row {row} is not whole on one line"


def _in_order(line: str, cells: list[str]) -> bool:
    """Every cell whole in `line`, left to right, none overlapping the one before."""
    pos = 0
    for c in cells:
        i = line.find(c, pos)
        if i < 0:
            return False
        pos = i + len(c)
    return True


def run(argv: list[str], capsys: pytest.CaptureFixture[str], tables: list[Table]) -> str:
    tables.clear()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert_whole(out, tables)
    return out


# --------------------------------------------------------------------------- every command at 80 columns


def test_match_at_80_columns(recorded: list[Table], capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["match", "--preset", "base"], capsys, recorded)
    assert "-0.05% params" in out  # the cell the old layout wrapped
    run(["match", "--preset", "base", "mixer=non_approximate", "layout=hybrid", "--breakdown"], capsys, recorded)
    assert len(recorded) == 3


def test_study_plan_at_80_columns(recorded: list[Table], capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["study", "plan", str(ROOT / "examples" / "variants.toml"), "--no-timing"], capsys, recorded)
    for label in ("nonappr", "hyb_non", "static_", "frozen_", "GFLOPs/token"):  # what used to be cut
        assert label in out
    labels = [r[0] for r in recorded[0].rows]
    assert any(len(lab) > 12 for lab in labels) and all(lab in out for lab in labels)
    out = run(["study", "plan", str(ROOT / "examples" / "quick.toml"), "--no-timing"], capsys, recorded)
    assert "final+noise" in out


def test_study_status_and_table_at_80_columns(study_data_dir: Path, tmp_path: Path, recorded: list[Table],
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from sanlab.study.orchestrate import Study
    from sanlab.study.spec import StudySpec

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    spec = StudySpec.model_validate({
        "name": "tables", "seeds": [1, 2], "data": {"dir": str(study_data_dir), "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param", "iso_depth"], "policy": "nearest", "tolerance": None},
        "sweep": {"tokens": 1000, "multipliers": [2, 4, 8], "extend": False}, "final": {"tokens": [1000]},
        "runner": {"workers": 2, "threads": 1}})
    study = tmp_path / "study"
    assert Study(spec, study, console=Console(file=io.StringIO()), train_fn="study_fakes:train").run() == 0
    run(["study", "status", str(study)], capsys, recorded)
    out = run(["study", "table", str(study)], capsys, recorded)
    assert "× floor" in out or "within noise" in out  # the verdict cell, whole


def test_prepare_and_signal_at_80_columns(tmp_path: Path, recorded: list[Table],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["prepare", "--corpus", "synth", "--out", str(tmp_path / "d"), "--tokens", "20k", "seq_len=32",
               "vocab_size=320"], capsys, recorded)
    assert "constrained-writing" in out and "creative-writing" in out
    run(["signal", "--depths", "2,4", "--rows", "2", "--seq-len", "16", "model.d_model=32", "model.n_heads=4",
         "model.n_kv_heads=2", "model.vocab_size=64"], capsys, recorded)


def test_analyze_at_80_columns(train_data_dir: Path, tmp_path: Path, recorded: list[Table],
                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=320)
    cps = {"milestone-000": lambda m: None, "milestone-100": lambda m: None, "latest": lambda m: None}
    a = write_run(tmp_path / "constrained-writing-arm", cfg.model_copy(update={"ffn": True}), cps, train_data_dir, 1)
    b = write_run(tmp_path / "san", cfg, cps, train_data_dir, 2)
    out = run(["analyze", str(a), "--vs", str(b), "--out", str(tmp_path / "out"), "--eval-rows", "40"], capsys,
              recorded)
    result = json.loads((tmp_path / "out" / "analysis.json").read_text())
    types = [g["group"] for g in result["runs"]["san"]["losses"]["exercise"]]
    assert "constrained-writing" in types  # the label the old layout cut to 'constrain…'
    assert all(f"│ {name} " in out for name in types)


def test_probe_command_at_80_columns(tmp_path: Path, recorded: list[Table], capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from probe_helpers import use_in_process_runner

    use_in_process_runner(monkeypatch)
    out = run(["probe", "retrieval", "--arms", "standard,san", "--out", str(tmp_path / "out"), "model.d_model=16",
               "model.n_heads=2", "model.n_kv_heads=1", "train.steps=3", "train.batch_rows=4", "row_tokens=64",
               "sweep.grid=[1]", "sweep.max_extensions=0", "task.n_train=40", "task.n_val=8", "task.n_test=12"],
              capsys, recorded)
    assert "retrieval/standard" in out and len(recorded) == 3  # cells, the grid, the paper's anchors


def test_probe_and_eval_tables_at_80_columns(recorded: list[Table], capsys: pytest.CaptureFixture[str]) -> None:
    """The probe suite's tables from the committed quick record's results, and the eval table."""
    from sanlab.eval.cli import results_table
    from sanlab.probes.suite import print_cells, print_table

    res = json.loads((ROOT / "records" / "2026-12-01-probes-quick" / "suite.json").read_text())
    with Output() as out:
        print_cells(res, out)
        print_table(res, out)
    assert_whole(capsys.readouterr().out, recorded)
    recorded.clear()
    records = [{"run": f"runs/{n}", "checkpoint": "latest", "tasks": {
        t: {"metrics": {"acc": 0.25, "acc_stderr": 0.03}} for t in
        ("sanlab_grounded_qa", "sanlab_closed_book_qa", "sanlab_closed_book_unseen", "sanlab_cloze")}}
        for n in ("san", "ffn")]
    with Output() as out:
        out.table(results_table(records, list(records[0]["tasks"])))
    assert_whole(capsys.readouterr().out, recorded)


# --------------------------------------------------------------------------- the layer itself


def _wide() -> Table:
    t = Table("a title longer than the forty columns this console is given, on one line")
    t.column("name")
    t.column("value", "right")
    t.add_row("nonapproximate_hybrid_variant", "0.1234 ± 0.0001", bold=[1])
    t.add_section()
    t.add_row("a|b", "x\ny")
    return t


def test_text_off_a_terminal_never_cuts_and_honours_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    buf = io.StringIO()
    with Output("text", buf) as out:
        out.table(_wide())
        out.note("a note longer than forty columns stays on one line, unwrapped, whole")
    text = buf.getvalue()
    lines = text.splitlines()
    assert lines[0] == _wide().title and "…" not in text
    assert any("nonapproximate_hybrid_variant" in ln and "0.1234 ± 0.0001*" in ln for ln in lines)  # bold: *
    assert lines[-1] == "a note longer than forty columns stays on one line, unwrapped, whole"
    narrow = Table("t")
    narrow.column("a")
    narrow.add_row("x")
    monkeypatch.setenv("COLUMNS", "240")
    buf = io.StringIO()
    with Output("text", buf) as out:
        assert out.console.width == 240
        out.table(narrow)
    assert max(len(ln) for ln in buf.getvalue().splitlines()) < 20  # a narrow table stays narrow


def test_md_csv_json_carry_the_same_cells() -> None:
    t = _wide()
    md, cs, js = io.StringIO(), io.StringIO(), io.StringIO()
    for fmt, buf in (("md", md), ("csv", cs), ("json", js)):
        with Output(fmt, buf) as out:
            out.table(t)
            out.note("n")
    assert md.getvalue().splitlines()[:5] == [f"**{t.title}**", "", "| name | value |", "|---|--:|",
                                              "| nonapproximate_hybrid_variant | **0.1234 ± 0.0001** |"]
    assert "| a\\|b | x y |" in md.getvalue()
    title, body = cs.getvalue().split("\n", 1)
    block, note = body.split("\n\n")
    assert title == f"# {t.title}" and note == "# n\n"
    # data: the emphasis as a boolean field of its own; quoted, newline kept
    assert list(csv.reader(io.StringIO(block + "\n"))) == [["name", "value", "value best"],
                                                           [*t.rows[0], "True"], [*t.rows[1], "False"]]
    doc = json.loads(js.getvalue())
    assert doc == {"tables": [{"title": t.title, "columns": ["name", "value", "value best"],
                               "rows": [[*t.rows[0], True], [*t.rows[1], False]]}], "notes": ["n"]}


def test_format_flag_on_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["match", "--preset", "base", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (t,) = doc["tables"]
    assert t["columns"][0] == "arm" and [r[0] for r in t["rows"]] == ["SAN", "FFN iso-param", "FFN iso-FLOP",
                                                                      "FFN iso-depth"]
    assert main(["match", "--preset", "base", "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0][0].startswith("# Matched arms") and rows[1][0] == "arm" and rows[2][:2] == ["SAN", "20L d512, no FFN"]
