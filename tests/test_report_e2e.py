"""`sanlab report` on a small real study (the real trainer, `sanlab study run --report`):
every figure is a valid, non-blank PNG, report.html embeds exactly those figures and
references nothing on the network, the tables equal the results store, and headless
Chromium renders the page."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sanlab.study.store import ResultStore

pytestmark = pytest.mark.slow

FIGURES = ("loss_curves.png", "sweep.png", "gaps.png", "delta_vs_budget.png", "delta_vs_size.png",
           "delta_by_region.png", "delta_by_exercise.png", "spectra.png", "attention.png", "stream.png")

SPEC = """
name = "report-e2e"
seeds = [1, 2]
[data]
dir = "{data}"
seq_len = 32
[model]
d_model = 32
n_layers = 5
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[train]
batch_rows = 8
eval_every = 0
eval_rows = 8
log_every = 1
milestones = [0.5, 1.0]
precision = "fp32"
[matching]
arms = ["iso_param", "iso_depth"]
policy = "nearest"
tolerance = 0.5
[sweep]
tokens = 1024
multipliers = [1, 2]
extend = false
[final]
tokens = [1024, 2048]
[runner]
workers = 2
threads = 1
"""


@pytest.fixture(scope="module")
def study(study_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished real study with its report (`study run --report`); (dir, stdout)."""
    root = tmp_path_factory.mktemp("report-e2e")
    (root / "spec.toml").write_text(SPEC.format(data=study_data_dir))
    proc = subprocess.run([sys.executable, "-m", "sanlab", "study", "run", str(root / "spec.toml"),
                           "--out", str(root / "study"), "--report"], capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "study", proc.stdout


def _png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from io import BytesIO

    img = Image.open(BytesIO(data))
    img.verify()
    return np.asarray(Image.open(BytesIO(data)).convert("L"), dtype=float)


def _not_blank(pixels: np.ndarray) -> None:
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 10 and (pixels < 200).mean() > 0.01  # ink on a white page


def test_every_figure_is_a_valid_png_and_the_last_line_is_the_path(study: tuple[Path, str]) -> None:
    d, out = study
    assert out.strip().splitlines()[-1] == str(d / "report" / "report.html")
    for name in FIGURES:
        _not_blank(_png((d / "report" / name).read_bytes()))
    assert len(list((d / "analysis").glob("final-*/analysis.json"))) == 4  # 2 budgets × 2 seeds


def test_html_embeds_the_figures_and_needs_no_network(study: tuple[Path, str]) -> None:
    d, _ = study
    html = (d / "report" / "report.html").read_text()
    embedded = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)
    files = {(d / "report" / n).read_bytes() for n in FIGURES}
    assert len(embedded) == len(FIGURES) and {base64.b64decode(e) for e in embedded} == files
    assert not re.search(r"https?://|src=\"//|<script|<link", html)
    assert 'class="placeholder"' not in html


def test_report_tables_equal_the_results_store(study: tuple[Path, str]) -> None:
    d, _ = study
    md = (d / "report" / "report.md").read_text()
    records = ResultStore(d).runs()

    locks = ResultStore(d).locks()

    def loss(arm: str, tokens: int, seed: int) -> float:
        """A final run's val loss: at the arm's locked LR (the reference's for the noise arm)."""
        lr = locks[("san" if arm == "san_rms" else arm, "muon")]["lr"]
        (r,) = [r for r in records.values() if r["arm"] == arm and r["tokens"] == tokens and r["seed"] == seed
                and r["lr"] == lr]
        return float(r["final"]["val_loss"])

    table = md.split("**Gap to the reference", 1)[1].split("\n\n", 2)[1].splitlines()[2:]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    assert len(rows) == 5  # 2 arms × 2 budgets + the noise floor
    for cells in rows:
        arm = "san_rms" if cells[0].startswith("noise floor") else cells[0].split(" ")[0]
        tokens = {"1.024K": 1024, "2.048K": 2048}[cells[3]]
        per = [loss(arm, tokens, s) - loss("san", tokens, s) for s in (1, 2)]
        assert cells[6] == f"s1: {per[0]:+.4f} s2: {per[1]:+.4f}"
        assert cells[7].startswith(f"{(per[0] + per[1]) / 2:+.4f} ± ")
        assert cells[4] == f"{(loss('san', tokens, 1) + loss('san', tokens, 2)) / 2:.4f}"
    # The sweep table: every finished point's loss, as stored.
    for r in records.values():
        if "sweep" in r["phases"]:
            assert f"{r['final']['val_loss']:.4f}" in md.split("## Learning-rate sweep", 1)[1]


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium package")
def test_chromium_renders_the_report(study: tuple[Path, str], tmp_path: Path) -> None:
    d, _ = study
    shot = tmp_path / "shot.png"
    cmd = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
           "--window-size=1300,6000", f"--screenshot={shot}", (d / "report" / "report.html").as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=180)
    _not_blank(_png(shot.read_bytes()))
    # The figures are drawn, not only text: a share of the page is coloured (lines, bars, heatmaps).
    rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    colourful = (rgb.max(axis=2) - rgb.min(axis=2)) > 60
    assert colourful.mean() > 0.005


def test_report_of_a_study_still_running(study: tuple[Path, str], tmp_path: Path) -> None:
    """Half the store, no analysis yet: the report is written, runs not in the store still
    draw their curves, and the missing parts are placeholders or "…" cells."""
    import shutil

    d, _ = study
    mid = tmp_path / "mid"
    shutil.copytree(d, mid, ignore=shutil.ignore_patterns("analysis", "report"))
    import json

    lines = (mid / "results.jsonl").read_text().splitlines()
    keep = [ln for ln in lines if json.loads(ln).get("multiplier") == 1.0 and "sweep" in json.loads(ln)["phases"]]
    (mid / "results.jsonl").write_text("\n".join(keep) + "\n")  # half the sweep: no cell is locked yet
    proc = subprocess.run([sys.executable, "-m", "sanlab", "report", str(mid)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    md = (mid / "report" / "report.md").read_text()
    assert "no paired analysis of the final runs yet" in md
    assert "Gap table: no arm has a locked LR yet" in md
    assert "Δ per matched arm: no matched pair of final runs has finished yet" in md
    # the header counts as `study status` does: the planned (sweep) runs, the 3 the store
    # lost still completed in their run dirs
    assert "6 completed; 3 of these runs are only in their run dirs, not in the results store" in md
    _not_blank(_png((mid / "report" / "loss_curves.png").read_bytes()))
    _not_blank(_png((mid / "report" / "sweep.png").read_bytes()))


def test_copied_study_analyses_its_own_runs_and_reports_a_failed_analysis(study: tuple[Path, str],
                                                                          tmp_path: Path) -> None:
    """A study dir copied elsewhere reads its own run dirs (not the paths stored when it ran);
    an analysis that fails under --analyze is printed and noted, and the report is still written."""
    import shutil

    d, _ = study
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns("report"))
    shutil.rmtree(copy / "analysis" / "final-muon-2048-s1")
    victim = next((copy / "runs").glob("iso_param-*-2.048K-s1"))
    shutil.rmtree(victim / "checkpoints")
    proc = subprocess.run([sys.executable, "-m", "sanlab", "report", str(copy), "--analyze", "--eval-rows", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "analysed [1/1]" in proc.stdout and "no checkpoint" in proc.stdout
    md = (copy / "report" / "report.md").read_text()
    assert f"analysis final-muon-2048-s1: {victim}: no checkpoint" in md
    _not_blank(_png((copy / "report" / "delta_by_region.png").read_bytes()))  # from the other pairs
