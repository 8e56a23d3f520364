"""`sanlab report` on a study run with the stand-in trainer (tests/study_fakes.py): no
training curves or analyses exist, so the report must still be written with placeholders;
the tables carry the store's numbers; bad input is one line and exit 2; the report code
imports without torch, and renders without it once the study's tables are computed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch_block import BLOCK_TORCH
from rich.console import Console

from sanlab.cli import main
from sanlab.study.orchestrate import Study
from sanlab.study.spec import StudySpec
from sanlab.study.store import ResultStore

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _fakes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def fake_study(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study whose runs have only meta.json (no metrics, no checkpoints)."""
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), old])
    try:
        spec = StudySpec.model_validate({
            "name": "fake", "seeds": [1, 2], "data": {"dir": str(study_data_dir), "seq_len": 32},
            "model": {"d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
            "matching": {"arms": ["iso_param", "iso_depth"], "policy": "nearest", "tolerance": None},
            # The SAN's best sweep point sits at the low edge (never turned), the others turn;
            # seed 1's final runs are sweep points (same budget), so the study stays small.
            "sweep": {"tokens": 1000, "multipliers": [2, 4, 8], "extend": False}, "final": {"tokens": [1000]},
            "runner": {"workers": 2, "threads": 1},
        })
        out = tmp_path_factory.mktemp("fake-study")
        assert Study(spec, out, console=Console(file=open(os.devnull, "w")), train_fn="study_fakes:train").run() == 0
    finally:
        os.environ["PYTHONPATH"] = old
    return out


def _gap_rows(md: str) -> dict[str, list[str]]:
    """The gap table of report.md: first cell -> cells."""
    lines = md.split("**Gap to the reference", 1)[1].split("\n\n", 2)[1].splitlines()
    return {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}


def _final_loss(study: Path, arm: str, seed: int) -> float:
    """The val loss of an arm's final run: at its locked LR, the final budget, this seed."""
    lock = ResultStore(study).locks()[(arm, "muon")]["lr"]
    (rec,) = [r for r in ResultStore(study).runs().values() if r["arm"] == arm and r["seed"] == seed
              and r["tokens"] == 1000 and r["lr"] == lock and r["status"] == "completed"]
    return float(rec["final"]["val_loss"])




@pytest.fixture(scope="module")
def fake_report(fake_study: Path) -> tuple[Path, str]:
    """`sanlab report FAKE_STUDY`, as a user runs it: (report dir, stdout)."""
    proc = subprocess.run([sys.executable, "-m", "sanlab", "report", str(fake_study)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return fake_study / "report", proc.stdout


def test_report_renders_without_torch(fake_study: Path, tmp_path: Path) -> None:
    """Computing the study's tables (the arms' accounting reads the mixers' torch-free specs),
    building every section and figure and writing report.md / report.html never touch torch."""
    out = tmp_path / "report"
    code = BLOCK_TORCH + ("from sanlab.cli import main\n"
                          f"rc = main(['report', {str(fake_study)!r}, '--out', {str(out)!r}])\n"
                          "assert 'torch' not in sys.modules, 'torch was imported'\n"
                          "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text()
    assert "iso_param (iso-param)" in md and "could not be computed" not in md
    assert (out / "gaps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_study_without_curves_or_analysis(fake_study: Path, fake_report: tuple[Path, str]) -> None:
    out, stdout = fake_report
    assert stdout.strip().splitlines()[-1] == str(out / "report.html")
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    # Sections without inputs are placeholders, not failures and not empty figures.
    assert "Loss curves: no run has logged a training step yet" in md
    assert "no paired analysis of the final runs yet" in md
    assert "no weight-spectra analysis yet" in md
    assert not (out / "loss_curves.png").exists() and not (out / "spectra.png").exists()
    assert html.count('class="placeholder"') == md.count("\n> _") >= 7
    # What there is to draw is drawn.
    for name in ("sweep.png", "gaps.png", "delta_vs_size.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "> **warning:** san muon: best LR 0.04 is still at an edge of the sweep" in md
    assert "iso_param muon: best LR" not in md
    # Every Δ in the gap table is the store's: arm loss − reference loss, seed by seed.
    rows = _gap_rows(md)
    for arm in ("iso_param", "iso_depth"):
        cells = rows[f"{arm} ({arm.replace('_', '-')})"]
        for seed in (1, 2):
            delta = _final_loss(fake_study, arm, seed) - _final_loss(fake_study, "san", seed)
            assert f"s{seed}: {delta:+.4f}" in cells[6]
        san = (_final_loss(fake_study, "san", 1) + _final_loss(fake_study, "san", 2)) / 2
        assert cells[4] == f"{san:.4f}"
    assert "noise floor (san_rms − san)" in rows


def test_status_shows_the_report_path(fake_study: Path, fake_report: tuple[Path, str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "status", str(fake_study)]) == 0
    assert f"report: {fake_report[0] / 'report.html'}" in capsys.readouterr().out


def test_not_a_study_dir_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a study dir" in err[0]
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


def test_report_out_that_is_a_file_is_one_line_exit_2(fake_study: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out` naming an existing file, given relative to the working directory: one line
    that says it is a file (it said "File exists"), exit 2, the file untouched."""
    (tmp_path / "afile").write_text("mine\n")
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(fake_study), "--out", "afile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sanlab: error: cannot write the report to afile: it is a file, not a directory"]
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_corrupt_results_line_is_reported_and_skipped(fake_study: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text((fake_study / "study.json").read_text())
    lines = (fake_study / "results.jsonl").read_text().splitlines()
    lines.insert(3, '{"type": "run", "run_id": "torn", "sta')
    (study / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["study", "status", str(study), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] is None
    assert main(["report", str(study)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "corrupt line(s) 4 skipped" in err[0] and err[0].startswith("sanlab: error:")
    md = (study / "report" / "report.md").read_text()
    assert "1 corrupt line(s) skipped (line 4)" in md
    assert "iso_param (iso-param)" in md  # the other lines still make the tables


def test_report_code_imports_without_torch() -> None:
    code = BLOCK_TORCH + ("import sanlab.report, sanlab.report.cli, sanlab.report.data, sanlab.report.plots\n"
                          "import sanlab.report.build, sanlab.report.html, sanlab.report.md\n"
                          "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _analysis(rid: str, ref: str, deltas: dict[str, float], tokens: int = 300) -> dict:
    """An analysis.json of one seed pair as `sanlab analyze ARM --vs REF` writes it (the
    region and exercise tables only)."""
    def table(names: dict[str, float]) -> dict:
        n = tokens * len(names)
        rows = [{"group": g, "tokens": tokens, "token_share": tokens / n, "loss_a": 4.0 + d, "loss_b": 4.0,
                 "delta": d, "weighted": d / len(names), "contribution": 0.0} for g, d in names.items()]
        agg = sum(r["weighted"] for r in rows)
        return {"rows": rows, "identity": {"aggregate_delta": agg, "weighted_sum": agg, "abs_error": 0.0,
                                           "rel_error": 0.0}}

    return {"runs": {rid: {}, ref: {}}, "sample": {"rows": 8, "exercises": ["math", "rag"]},
            "comparisons": [{"run": rid, "vs": ref, "region": table(deltas),
                             "exercise": table({"math": deltas["query"], "rag": deltas["trace"]})}]}


def test_region_and_exercise_delta_is_the_mean_and_sample_sd_of_the_analysed_pairs(
        fake_study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two analysed seed pairs of iso_param with query Δ −0.1 and +0.1: the report's table says
    +0.0000 ± 0.1414 (sample sd, n − 1; the population sd would be 0.1000), and its figure's
    error bar is the same."""
    import shutil

    from sanlab.report import plots
    from sanlab.report.data import load
    from sanlab.study.results import table_json

    study = tmp_path / "study"
    shutil.copytree(fake_study, study, ignore=shutil.ignore_patterns("report"))
    (gap,) = [g for g in table_json(study)["gaps"] if g["arm"] == "iso_param"]
    for seed, sign in (("1", -1.0), ("2", 1.0)):
        ids = gap["runs"][seed]
        d = study / "analysis" / f"final-muon-1000-s{seed}"
        d.mkdir(parents=True)
        (d / "analysis.json").write_text(json.dumps(_analysis(ids["arm"], ids["reference"],
                                                             {"query": sign * 0.1, "trace": -0.2 + sign * 0.05})))
    assert main(["report", str(study)]) == 0
    capsys.readouterr()
    md = (study / "report" / "report.md").read_text()
    region = md.split("**Δ by region", 1)[1].split("\n\n", 2)[1].splitlines()
    header = [c.strip() for c in region[0].strip("|").split("|")]
    row = next([c.strip() for c in ln.strip("|").split("|")] for ln in region[2:] if ln.startswith("| iso_param"))
    assert row[header.index("query")] == "+0.0000 ± 0.1414"
    assert row[header.index("trace")] == f"{-0.2:+.4f} ± {0.05 * 2 ** 0.5:.4f}"
    exercise = md.split("**Δ by exercise", 1)[1].split("\n\n", 2)[1]
    assert "| iso_param | +0.0000 ± 0.1414 | -0.2000 ± 0.0707 |" in exercise
    st = plots.group_stats(load(study), "region")
    assert st["cells"]["iso_param"]["query"]["err"] == pytest.approx((0.1 * 2 ** 0.5,) * 2)
