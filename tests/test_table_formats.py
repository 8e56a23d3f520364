"""Tables as data and as text (`sanlab.tables`), as a user reads them, from a working
directory of their own with relative paths:
- csv and json hold numbers as numbers, one value per field (pandas reads them typed);
- every table-printing command's text, md, csv and json show the same values, and stdout
  holds only the result (progress goes to stderr in csv and json);
- on an 80-column terminal no number is split: columns are left out, with a note;
- the study's data and Δ-against-axis tables hold what their definitions say."""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from sanlab.cli import main
from sanlab.study.orchestrate import Study
from sanlab.study.plan import build_arms, data_points, run_id
from sanlab.study.spec import StudySpec
from sanlab.study.table import axis_table, data_table
from sanlab.tables import Output, Table

TESTS = Path(__file__).parent
ROOT = TESTS.parent

SPEC = """name = "fmt"
seeds = [1, 2]
[data]
dir = "data"
seq_len = 32
[model]
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[matching]
arms = ["iso_param", "iso_depth"]
policy = "nearest"
tolerance = 0.5
[sweep]
tokens = "1K"
multipliers = [0.5, 1, 2]
[final]
tokens = ["2K"]
[runner]
workers = 1
threads = 1
"""


@pytest.fixture(scope="module")
def study(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study (stand-in trainer, tests/study_fakes.py) in a user's directory."""
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(study_data_dir, home / "data")
    (home / "spec.toml").write_text(SPEC)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        mp.setattr("sanlab.commands.study.Study", functools.partial(Study, train_fn="study_fakes:train"))
        assert main(["study", "run", "spec.toml", "--out", "runs/s"]) == 0
    return home


def _out(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    capsys.readouterr()
    assert main(argv) == 0, argv
    got = capsys.readouterr()
    return got.out, got.err


# --------------------------------------------------------------------------- numbers as numbers


def test_csv_and_json_hold_numbers_as_numbers(study: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(study)
    out, _ = _out(["study", "table", "runs/s", "--format", "csv"], capsys)
    blocks = [b for b in out.split("\n\n") if any(not ln.startswith("#") for ln in b.splitlines())]
    by_title = {b.splitlines()[0]: b for b in blocks}
    gap = next(b for t, b in by_title.items() if t.startswith("# Gap"))
    sweep = next(b for t, b in by_title.items() if t.startswith("# LR sweep"))
    data = next(b for t, b in by_title.items() if t.startswith("# Data"))
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - the venv has pandas
        pd = None
    if pd is not None:
        g = pd.read_csv(io.StringIO(gap), comment="#")
        for col in ("tokens", "san loss", "arm loss", "Δ s1", "Δ s2", "Δ mean", "Δ sd", "Δ %"):
            assert pd.api.types.is_numeric_dtype(g[col]), (col, g[col].dtype)
        assert (g["tokens"] == 2000).all()
        assert g["Δ mean"].iloc[0] == pytest.approx((g["Δ s1"].iloc[0] + g["Δ s2"].iloc[0]) / 2)
        sw = pd.read_csv(io.StringIO(sweep), comment="#")
        assert sw["1× best"].dtype == bool and sw["lock at edge"].dtype == bool
        assert pd.api.types.is_numeric_dtype(sw["lock lr"]) and pd.api.types.is_numeric_dtype(sw["base LR"])
        assert (sw[[c for c in sw.columns if c.endswith("× best")]].sum(axis=1) == 1).all()  # one best per row
        d = pd.read_csv(io.StringIO(data), comment="#")
        assert pd.api.types.is_integer_dtype(d["non-emb params"]) and pd.api.types.is_integer_dtype(d["facts"])
    rows = list(csv.reader(io.StringIO(gap.split("\n", 1)[1])))
    header = rows[0]
    assert {"Δ mean", "Δ sd", "Δ s1", "Δ s2"} <= set(header)
    assert not any("±" in c or re.fullmatch(r"-?\d{1,3}(,\d{3})+", c) for r in rows[1:] for c in r)
    float(rows[1][header.index("Δ sd")])
    out, _ = _out(["study", "table", "runs/s", "--format", "json"], capsys)
    doc = json.loads(out)
    t = next(t for t in doc["tables"] if t["title"].startswith("Gap"))
    i = t["columns"].index("Δ mean")
    assert all(isinstance(r[i], float) for r in t["rows"])
    sw_t = next(t for t in doc["tables"] if t["title"].startswith("LR sweep"))
    flags = [j for j, c in enumerate(sw_t["columns"]) if c.endswith("× best")]
    assert flags and all(isinstance(r[j], bool) for r in sw_t["rows"] for j in flags)


# --------------------------------------------------------------------------- one family: four formats, same values


_NUM = re.compile(r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?([KMBT%]?)")
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "%": 1.0, "": 1.0}


def _shown(text: str) -> list[tuple[float, float]]:
    """Each number a cell shows, as (value, half its last digit's unit): what it rounds."""
    out = []
    for m in _NUM.finditer(text.replace("−", "-")):
        raw = m.group(0).rstrip("KMBT%").replace(",", "")
        scale = _SCALE[m.group(1)]
        dec = len(raw.split(".")[1].split("e")[0]) if "." in raw else 0
        exp = int(raw.split("e")[1]) if "e" in raw else 0
        out.append((float(raw) * scale, 0.5 * 10 ** (exp - dec) * scale * 1.0001))
    return out


def _agree(table: dict[str, Any], md_rows: list[list[str]], name: str) -> None:
    """Every number a json field holds is what its md cell shows, to the shown digits."""
    fields = table["columns"]
    for r, row in enumerate(table["rows"]):
        numbers = [v for v in row if isinstance(v, (int, float)) and not isinstance(v, bool)]
        shown = [n for cell in md_rows[r] for n in _shown(cell)]
        for v in numbers:
            assert any(abs(v - s) <= tol or (math.isclose(abs(v), abs(s), rel_tol=1e-3)) for s, tol in shown), \
                f"{name}: row {r} field value {v} not shown in {md_rows[r]} ({fields})"
        strings = [v for v in row if isinstance(v, str)]
        assert all(any(v in cell or cell in v for cell in md_rows[r]) for v in strings), (name, strings, md_rows[r])


def _md_tables(md: str) -> list[list[list[str]]]:
    tables, cur = [], None
    for line in md.splitlines():
        if line.startswith("| "):
            cells = [c.strip().strip("*").replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if cur is None:
                cur = []
                tables.append(cur)
                continue  # the header
            cur.append(cells)
        elif line.startswith("|"):
            continue  # the alignment row
        else:
            cur = None
    return tables


def _csv_blocks(out: str) -> list[list[list[str]]]:
    """stdout of --format csv as its tables; every line must be a comment, blank or a row of a block."""
    blocks = []
    for block in out.split("\n\n"):
        lines = [ln for ln in block.splitlines() if not ln.startswith("#")]
        if not lines:
            continue
        rows = list(csv.reader(io.StringIO("\n".join(lines) + "\n")))
        assert len({len(r) for r in rows}) == 1, f"a line that is not a row of its table: {rows}"
        blocks.append(rows)
    return blocks


def _family(argv: list[str], capsys: pytest.CaptureFixture[str], fresh: Any = None) -> None:
    outs = {}
    for fmt in ("text", "md", "csv", "json"):
        if fresh is not None:
            fresh()
        outs[fmt], _ = _out([*argv, "--format", fmt], capsys)
    doc = json.loads(outs["json"])  # stdout is one JSON document, nothing else
    md = _md_tables(outs["md"])
    blocks = _csv_blocks(outs["csv"])
    assert len(md) == len(blocks) == len(doc["tables"]), argv
    for t, m, b in zip(doc["tables"], md, blocks):
        assert b[0] == t["columns"], (argv, b[0])
        assert len(b) - 1 == len(t["rows"]) == len(m), (argv, t["title"])
        for crow, jrow in zip(b[1:], t["rows"]):  # csv and json: the same values
            assert crow == ["" if v is None else str(v) for v in jrow], (argv, crow, jrow)
        _agree(t, m, f"{' '.join(argv)}: {t['title'][:40]}")
        assert t["title"] in outs["text"], argv  # off a terminal the title is one line of text
        for mrow in m:  # and every cell whole on one line of the text table
            cells = [c for c in mrow if c]
            assert any(all(c in ln for c in cells) for ln in outs["text"].splitlines()), (argv, cells)


def test_every_table_command_prints_the_same_values_in_every_format(
        study: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(study)
    monkeypatch.setenv("COLUMNS", "80")
    _family(["match", "--preset", "base"], capsys)
    _family(["study", "plan", "spec.toml", "--no-timing"], capsys)
    _family(["study", "status", "runs/s"], capsys)
    _family(["study", "table", "runs/s"], capsys)
    _family(["signal", "--depths", "2,4", "--rows", "2", "--seq-len", "16", "model.d_model=32", "model.n_heads=4",
             "model.n_kv_heads=2", "model.vocab_size=64"], capsys)
    _family(["prepare", "--corpus", "synth", "--out", "p", "--tokens", "20k", "seq_len=32", "vocab_size=320"],
            capsys, fresh=lambda: shutil.rmtree("p", ignore_errors=True))


def test_csv_progress_goes_to_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`prepare` reports its BPE training as it goes: in csv that line is on stderr, and
    stdout is nothing but the tables."""
    monkeypatch.chdir(tmp_path)
    out, err = _out(["prepare", "--corpus", "synth", "--out", "p", "--tokens", "20k", "seq_len=32",
                     "vocab_size=320", "--format", "csv"], capsys)
    assert "training a 320-token BPE" in err and "training a" not in out
    assert _csv_blocks(out)


# --------------------------------------------------------------------------- an 80-column terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_80_column_terminal_never_splits_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    t = Table("a wide table")
    t.column("arm")
    names = ["config", "loss", "Δ per seed", "Δ mean ± sd", "params", "tokens", "verdict"]
    for n in names:
        t.column(n, "left" if n in ("config", "verdict") else "right")
    t.add_row("iso_param (iso-param)", "1L d64, d_ff 256", "4.6841", "-0.3070 -0.3217", "-0.3144 ± 0.0104",
              "123,268", "500K", "iso_param ahead, 33× floor")
    buf = _Terminal()
    out = Output("text", buf)
    assert out.console.is_terminal and out.console.width == 80
    out.table(t)
    out.close()
    text = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    flat = " ".join(ln.strip() for ln in lines)
    note = flat[flat.index("note: column(s) "):]
    assert "left out to fit 80 columns" in note
    left_out = [n for n in names if f" {n}," in note or f" {n} left out" in note]
    assert left_out, note
    for cell, name in zip(t.rows[0][1:], names):  # a number is whole on a line, or its column is named
        if t.columns[names.index(name) + 1].justify == "right":
            assert name in left_out or any(cell in ln for ln in lines), f"{cell} split"
    assert any("iso_param" in ln for ln in lines)


# --------------------------------------------------------------------------- the study's tables by their definitions


def _spec(**extra: Any) -> StudySpec:
    raw: dict[str, Any] = {
        "name": "defs", "seeds": [1, 2], "data": {"dir": "data", "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
        "matching": {"arms": ["iso_param"], "policy": "nearest", "tolerance": None},
        "sweep": {"enabled": False}, "final": {"tokens": [2000]}}
    raw.update(extra)
    return StudySpec.model_validate(raw)


def _as_data(t: Table) -> tuple[list[str], list[list[Any]]]:
    buf = io.StringIO()
    with Output("json", buf) as out:
        out.table(t)
    doc = json.loads(buf.getvalue())["tables"][0]
    return doc["columns"], doc["rows"]


def test_data_table_puts_facts_per_param_and_bits_per_param_where_their_names_say() -> None:
    spec = _spec()
    arms = build_arms(spec)
    facts, bits = 6400, 40446  # bits/fact 6.32: far from 1, so the two readings cannot coincide
    info = {"": {"world": {"facts": facts, "bits": bits, "bits_per_fact": bits / facts},
                 "train_tokens": 1000, "floor": {"val": 0.1}}}
    t = data_table(spec, arms, info, data_points(spec, None))
    assert t is not None
    cols, rows = _as_data(t)
    for a, row in zip(arms, rows):
        n = a.params_non_embedding
        assert row[cols.index("facts/param")] == pytest.approx(facts / n)
        assert row[cols.index("bits/param")] == pytest.approx(bits / n)
        assert row[cols.index("non-emb params")] == n


def _axis_records(spec: StudySpec, gap: float, floor: tuple[float, float] | None) -> dict[str, dict]:
    """Final runs at base LR on both axis values: the arm `gap` nats from the reference in
    every seed, the noise pair (when given) `floor` apart per seed."""
    arms = build_arms(spec)
    ref, arm = arms
    records = {}
    for p in data_points(spec, None):
        for s in spec.seeds:
            lr_ref, lr_arm = ref.base_lr_for(spec, "muon"), arm.base_lr_for(spec, "muon")
            for a, lr, loss in ((ref, lr_ref, 3.0 + 0.001 * s), (arm, lr_arm, 3.0 + gap + 0.002 * s)):
                records[run_id(a, "muon", lr, 2000, s, p.slug)] = {"status": "completed", "final": {"val_loss": loss}}
            if floor is not None:
                from sanlab.study.plan import noise_arm

                records[run_id(noise_arm(spec), "muon", lr_ref, 2000, s, p.slug)] = {
                    "status": "completed", "final": {"val_loss": 3.0 + 0.001 * s + floor[s - 1]}}
    return records


@pytest.mark.parametrize("floor, marked", [(None, False), ((0.001, -0.001), True), ((0.3, 0.4), False)])
def test_axis_table_marks_beyond_noise_only_against_a_noise_floor(floor: Any, marked: bool) -> None:
    """`*`: |Δ mean| above the floor's size F (max of |its mean|, its sd) plus Δ's own sd.
    Without a noise pair there is no floor, and nothing is marked, however large Δ is."""
    spec = _spec(data={"corpus": "synth", "tokens": 3000, "seq_len": 32, "axis": {"synth.facts": [64, 128]}},
                 noise={"enabled": floor is not None})
    t = axis_table(spec, build_arms(spec), _axis_records(spec, -0.2, floor), data_points(spec, None))
    cells = [c for c in t.rows[0][3:]]
    assert len(cells) == 2 and all(c.startswith("-0.1985 ± 0.0007") for c in cells), cells
    assert all(c.endswith("*") == marked for c in cells), (floor, cells)
    cols, rows = _as_data(t)
    flags = [rows[0][j] for j, c in enumerate(cols) if c.endswith("beyond noise")]
    assert flags == [marked, marked]
