"""Each report figure checked on the data behind it, not its pixels: which series are drawn
and how (the artists' gids, styles, values), shared axes, the annotations a reader needs,
and a note for every group left out or greyed. The study is `tests/report_study.py`."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pytest

import report_study as R
from sanlab.report import plots

matplotlib.use("Agg")


@pytest.fixture
def data(tmp_path: Path):
    return R.study(tmp_path)


def _by_gid(fig, prefix: str) -> dict[str, object]:
    return {a.get_gid(): a for a in fig.findobj() if isinstance(a.get_gid(), str) and a.get_gid().startswith(prefix)}


def _close(drawn: plots.Drawn) -> None:
    import matplotlib.pyplot as plt

    plt.close(drawn.fig)


def test_ema_is_the_debiased_exponential_average() -> None:
    x = [4.0, 2.0, 6.0]
    a = 2 / (3 + 1)
    m1 = a * 4.0
    m2 = (1 - a) * m1 + a * 2.0
    m3 = (1 - a) * m2 + a * 6.0
    assert plots.ema(x, 3) == pytest.approx([m1 / (1 - (1 - a)), m2 / (1 - (1 - a) ** 2), m3 / (1 - (1 - a) ** 3)])
    assert plots.ema([5.0] * 4, 9) == pytest.approx([5.0] * 4)  # debiasing: a constant stays constant


def test_loss_curves_smooth_finals_over_faint_raw_and_draw_the_noise_arm_dashed(data) -> None:
    drawn = plots.draw_loss_curves(data)
    fig = drawn.fig
    ax_t, ax_v = fig.axes[:2]
    smooth, raw, val = _by_gid(fig, "smooth:"), _by_gid(fig, "raw:"), _by_gid(fig, "val:")
    finals = [r for r in data.records if plots.run_kind(data, r) == "final"]
    noise = [r for r in data.records if plots.run_kind(data, r) == "noise"]
    sweeps = [r for r in data.records if plots.run_kind(data, r) == "sweep"]
    assert len(finals) == 4 * 2 * 2 and len(noise) == 2 and len(sweeps) == 12
    assert set(smooth) == {f"smooth:{r}" for r in data.curves}  # every run: one smoothed line
    assert set(raw) == {f"raw:{r}" for r in finals}  # the faint raw curve behind each final run
    for r in finals:
        c = data.curves[r]
        line = smooth[f"smooth:{r}"]
        assert list(line.get_ydata()) == pytest.approx(plots.ema(c.loss, plots.smoothing_span(len(c.loss))))
        assert list(raw[f"raw:{r}"].get_ydata()) == c.loss
        assert raw[f"raw:{r}"].get_alpha() < 0.5 < line.get_alpha()
        assert line.get_linestyle() == "-"
        assert len(val[f"val:{r}"].get_xdata()) >= 3  # evaluated during the run, not only at its end
    for r in noise:  # the control arm: dashed, on top of the reference it duplicates
        assert smooth[f"smooth:{r}"].get_linestyle() == "--" and val[f"val:{r}"].get_linestyle() == "--"
        assert smooth[f"smooth:{r}"].get_color() != smooth[f"smooth:{R.run_id('san', R.BUDGETS[0], 1)}"].get_color()
    assert all(smooth[f"smooth:{r}"].get_linestyle() == ":" for r in sweeps)
    lines = ax_t.get_lines()
    assert max(i for i, ln in enumerate(lines) if ln.get_gid() in {f"smooth:{r}" for r in noise}) > \
        max(i for i, ln in enumerate(lines) if ln.get_gid() == f"smooth:{R.run_id('san', R.BUDGETS[0], 1)}")
    assert ax_t.get_xscale() == "log" and ax_v.get_xscale() == "log"
    assert any("moving average" in n for n in drawn.notes)
    _close(drawn)


def test_sweep_panels_share_one_y_axis_of_loss_minus_each_cells_best(data) -> None:
    drawn = plots.draw_sweep(data)
    axes = [ax for ax in drawn.fig.axes if ax.get_visible()]
    assert len(axes) == 4
    shared = axes[0].get_shared_y_axes()
    assert all(shared.joined(axes[0], ax) for ax in axes[1:])
    for row in data.tables["sweep"]:
        (line,) = [a for a in _by_gid(drawn.fig, "sweep:").values() if a.get_gid() == f"sweep:{row['arm']}:muon"]
        best = min(row["losses"].values())
        want = sorted((row["base_lr"] * float(m), v - best) for m, v in row["losses"].items())
        assert list(line.get_xdata()) == pytest.approx([x for x, _ in want])
        assert list(line.get_ydata()) == pytest.approx([y for _, y in want])
        assert min(line.get_ydata()) == 0.0
    assert any("shared y axis" in n for n in drawn.notes)
    _close(drawn)


def test_sweep_panels_draw_the_noise_floor_above_the_best_and_flag_a_lock_within_it(data) -> None:
    """Each panel shades [0, F] (F: the study's noise floor size, R.FLOOR), so a point in the
    band is not told apart from the lock; a row the study flags (`within_floor`) says so in
    its panel's title, and the others do not."""
    import copy

    flagged = copy.copy(data)
    flagged.tables = {**data.tables, "sweep": [dict(r) for r in data.tables["sweep"]]}
    flagged.tables["sweep"][1]["within_floor"] = True
    drawn = plots.draw_sweep(flagged)
    bands = _by_gid(drawn.fig, "floor:")
    assert set(bands) == {f"floor:{r['arm']}:muon" for r in data.tables["sweep"]}
    for band in bands.values():
        assert band.get_y() == pytest.approx(0.0) and band.get_height() == pytest.approx(R.FLOOR)  # y in data units
    titles = [ax.get_title() for ax in drawn.fig.axes if ax.get_visible()]
    assert ["within the noise floor" in t for t in titles] == [False, True, False, False], titles
    assert any("noise floor F" in n for n in drawn.notes)
    _close(drawn)


def test_gap_bars_carry_their_size_in_noise_floors(data) -> None:
    drawn = plots.draw_gaps(data)
    labels = _by_gid(drawn.fig, "floor:")
    bars = [g for g in data.tables["gaps"]]
    assert len(labels) == len(bars) == 6
    for g in bars:
        text = labels[f"floor:{g['arm']}:muon:{g['tokens']}"].get_text()
        assert text == f"{abs(g['mean']) / R.FLOOR:.0f}× floor"  # = the gap table's verdict
        assert text in g["verdict"]
    band = _by_gid(drawn.fig, "noise-band")["noise-band"]
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((-R.FLOOR, R.FLOOR))
    assert any("noise floors" in n for n in drawn.notes)
    _close(drawn)


def test_gap_label_within_noise_and_before_a_floor() -> None:
    g = {"mean": -0.001, "verdict": "within noise"}
    assert plots.floor_label(g, 0.004) == "within noise"
    assert plots.floor_label({"mean": -0.3, "verdict": "iso_param ahead (no floor yet)"}, None) is None


def test_delta_vs_size_is_points_not_a_line_through_the_matching_criteria(data) -> None:
    drawn = plots.draw_delta_vs_size(data)
    ax = drawn.fig.axes[0]
    points = _by_gid(drawn.fig, "size:")
    assert len(points) == 6  # 3 arms × 2 budgets, one point each
    for line in ax.get_lines():
        if line.get_gid() == "zero":
            continue  # the Δ = 0 reference line
        xs = line.get_xdata()
        # nothing joins two points: every line with data is one marker, drawn without a line
        assert len(xs) <= 1 or line.get_linestyle() in ("None", "none", " ", ""), line.get_gid()
    annotations = [t.get_text() for t in ax.texts]
    assert sum("iso-param" in t for t in annotations) == 2 and sum("iso-depth" in t for t in annotations) == 2
    assert any("not a ladder" in n for n in drawn.notes)
    _close(drawn)


def test_delta_by_exercise_shows_n_greys_thin_groups_and_lists_absent_types(data) -> None:
    drawn = plots.draw_grouped_deltas(data, "exercise")
    ax = drawn.fig.axes[0]
    st = plots.group_stats(data, "exercise")
    present = [g for g in R.EXERCISES if g not in R.ABSENT]
    assert st["groups"] == present and st["absent"] == list(R.ABSENT)
    assert st["thin"] == ["math-mcq"]  # 12 tokens < 200
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    for g, tick in zip(present, ticks):
        assert tick.startswith(f"{g}\nN = {R.TOKENS[g]:,}")
        assert ("too few" in tick) == (g == "math-mcq")
    bars = _by_gid(drawn.fig, "group:")
    assert len(bars) == 3 * len(present)  # no group dropped
    for gid, patch in bars.items():
        grey = patch.get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb("#bbbbbb"))
        assert grey == gid.endswith(":math-mcq"), gid
    absent = _by_gid(drawn.fig, "absent")["absent"].get_text()
    assert all(t in absent for t in R.ABSENT)
    assert any("editing, creative-writing" in n for n in drawn.notes) and any("math-mcq" in n for n in drawn.notes)
    _close(drawn)


def test_delta_by_region_error_bars_are_the_sample_sd_of_two_seed_pairs(data) -> None:
    """Seed pairs at base ∓ 0.05: mean = base, sample sd = √(2 · 0.05² / 1) = 0.0707 (the
    population sd would be 0.05)."""
    st = plots.group_stats(data, "region")
    for arm, base in R.GROUP_BASE.items():
        for i, g in enumerate(R.REGION_TOKENS):
            c = st["cells"][f"{arm} 1M"][g]
            assert c["mean"] == pytest.approx(base + 0.02 * i)
            assert c["err"] == pytest.approx((math.sqrt(2) * R.SPREAD, math.sqrt(2) * R.SPREAD)) and c["kind"] == "sd"
    drawn = plots.draw_grouped_deltas(data, "region")
    assert st["thin"] == ["other"] and "sd over seed pairs" in drawn.fig.axes[0].get_title()
    _close(drawn)


def test_one_seed_pair_gets_the_per_token_bootstrap_interval(tmp_path: Path) -> None:
    data = R.study(tmp_path, seeds=(1,))
    st = plots.group_stats(data, "exercise")
    c = st["cells"]["iso_param 1M"]["mcq"]
    assert c["kind"] == "bootstrap" and c["n_pairs"] == 1
    assert c["err"] == pytest.approx((0.03, 0.02))  # mean − lo, hi − mean of the analysis's interval
    drawn = plots.draw_grouped_deltas(data, "exercise")
    assert "bootstrap" in drawn.fig.axes[0].get_title() and any("bootstrap" in n for n in drawn.notes)
    _close(drawn)


def test_spectra_palette_apart_from_the_arms_and_markers_checked_against_their_curve(data) -> None:
    drawn = plots.draw_spectra(data)
    arm_colours = {matplotlib.colors.to_hex(c) for c in plots.COLORS}
    lines = _by_gid(drawn.fig, "type:")
    assert len(lines) == 4 + 3 * 7  # the SAN's Q K V O, each standard arm's seven types
    assert not {matplotlib.colors.to_hex(ln.get_color()) for ln in lines.values()} & arm_colours
    settled = _by_gid(drawn.fig, "settled:")
    assert set(settled) == {f"settled:{a}:Q" for a in R.ARMS}  # Q settles at 25%; nothing else does
    for gid, marker in settled.items():
        arm, t = gid.split(":")[1:]
        curve = list(zip(lines[f"type:{arm}:{t}"].get_xdata(), lines[f"type:{arm}:{t}"].get_ydata()))
        (x,), (y,) = marker.get_xdata(), marker.get_ydata()
        assert (x, y) in curve
        after = [v for m, v in curve if m >= x]
        assert all(abs(b - a) / a < 0.02 for a, b in zip(after, after[1:]))  # the curve is flat from there
    # The stale 'down settled at 0%' (its curve falls 28.5 → 19.8) is not drawn, and the caption says why.
    assert not any(g.endswith(":down") for g in settled)
    assert any("down at 0%" in n for n in drawn.notes)
    assert any("less than 0.02" in n and "less than 2%" in n for n in drawn.notes)  # the rule, in the caption
    _close(drawn)


def test_settled_holds_is_the_relative_change_rule() -> None:
    pts = [(0.0, 10.0), (0.5, 15.0), (1.0, 15.2)]
    assert plots.settled_holds(pts, 0.5, 0.02) and not plots.settled_holds(pts, 0.0, 0.02)


def test_attention_heatmaps_start_at_zero_and_the_metrics_are_defined(data) -> None:
    drawn = plots.draw_attention(data)
    images = _by_gid(drawn.fig, "heat:")
    assert set(images) == {f"heat:{k}" for k, _, _ in plots.ATTENTION_METRICS}
    for key, title, _ in plots.ATTENTION_METRICS:
        im = images[f"heat:{key}"]
        vmax = max(row[key] for _, r in plots.analysed_runs(data, "attention") for row in r["attention"]["layers"])
        assert im.norm.vmin == 0.0 and im.norm.vmax == pytest.approx(vmax)
        assert any(ax.get_title().startswith(title) and f"0 to {vmax:.3g}" in ax.get_title() for ax in drawn.fig.axes)
    caption = " ".join(drawn.notes)
    for word in ("entropy:", "sink mass:", "local focus", "head diversity:", "Colour scale"):
        assert word in caption
    _close(drawn)


def test_residual_gates_are_drawn_against_their_value_at_init(data) -> None:
    drawn = plots.draw_stream(data)
    ax_g = drawn.fig.axes[1]
    (ref,) = _by_gid(drawn.fig, "gate-init").values()
    assert list(ref.get_ydata()) == [0.5, 0.5]
    lo, hi = ax_g.get_ylim()
    values = [v for a in _by_gid(drawn.fig, "gate:").values() for v in a.get_ydata()]
    assert lo <= 0.4 and hi >= 0.6 and lo <= min(values) and hi >= max(values)
    assert len(_by_gid(drawn.fig, "gate:")) == 4 + 3  # attn per arm, ffn per standard arm
    assert any("0.5" in n for n in drawn.notes)
    _close(drawn)


def test_every_figure_of_the_study_is_drawn_with_a_caption(synthetic_report) -> None:
    report, _ = synthetic_report
    figures = [b for s in report.sections for b in s.blocks if b.kind == "figure"]
    assert {b.path.name for b in figures} == {"loss_curves.png", "sweep.png", "gaps.png", "delta_vs_budget.png",
                                              "delta_vs_size.png", "delta_by_region.png", "delta_by_exercise.png",
                                              "spectra.png", "attention.png", "stream.png"}
    assert all(b.text and b.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for b in figures)
