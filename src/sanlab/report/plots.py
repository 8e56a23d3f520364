"""The report's figures: matplotlib with the Agg backend, one PNG per figure.

Each `draw_*` function takes the study's plain data and returns a `Drawn` (the figure,
plus the sentences its caption must add: the rule behind a marker, what was greyed out
or left out and why), or the reason it has nothing to draw (the report shows that reason
as the section's placeholder). `save` writes a `Drawn` as a PNG. The artists a test
checks carry a `gid` ("smooth:RUN_ID", "floor:ARM", …), so tests read what was drawn
from the figure's data, never from pixels. Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from sanlab.analysis.kinds import kind_deltas  # noqa: E402  (torch-free)
from sanlab.analysis.output import MIN_GROUP_TOKENS  # noqa: E402  (torch-free)
from sanlab.report.data import StudyData  # noqa: E402
from sanlab.study.noise import nats  # noqa: E402  (torch-free)

DPI = 110
COLORS = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # the arms' colours
REGIONS = ("query", "trace", "answer", "other")
# Matrix types get a palette of their own (ColorBrewer Dark2), never an arm's colour; routing
# matrices solid, content matrices dashed.
TYPE_COLORS: dict[str, str] = {"Q": "#1b9e77", "K": "#d95f02", "V": "#7570b3", "O": "#e7298a",
                               "gate": "#66a61e", "up": "#e6ab02", "down": "#a6761d"}
TYPE_STYLES: dict[str, str] = {"Q": "-", "K": "-", "V": "--", "O": "--", "gate": ":", "up": ":", "down": "--"}
OTHER_TYPE_COLORS = ("#666666", "#1f1f1f", "#999999", "#4d4d4d")
SMOOTH_FRACTION = 0.05  # the training-loss EMA spans this share of a run's logged steps
# SPEC §3's attention metrics, one line each (sanlab.analysis.metrics.attention_sums)
ATTENTION_METRICS: tuple[tuple[str, str, str], ...] = (
    ("entropy", "entropy (nats)",
     "entropy: −Σⱼ Aᵢⱼ log Aᵢⱼ of a query's attention, mean over queries (uniform over i+1 keys gives log(i+1))"),
    ("sink", "sink mass",
     "sink mass: the attention a query puts on its segment's first token, mean over the later queries"),
    ("local_0", "local focus, distance 0",
     "local focus (distance 0): Aᵢᵢ, the attention a query puts on its own position"),
    ("head_diversity", "head diversity",
     "head diversity: the standard deviation of Aᵢⱼ across heads, mean over the causal triangle"),
)


@dataclass
class Drawn:
    """A drawn figure and what its caption must add."""

    fig: Figure
    notes: list[str] = field(default_factory=list)


def save(drawn: Drawn, path: Path) -> None:
    """Write the PNG atomically (readers never see half a file) and free the figure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    drawn.fig.savefig(tmp, dpi=DPI, format="png")
    plt.close(drawn.fig)
    os.replace(tmp, path)


def _fmt_tokens(n: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


def _log_axis(ax: Any, which: str = "x", fmt: Callable[[float], str] | None = None,
              ticks: Sequence[float] | None = None) -> None:
    """A log axis with readable labels: 1K 2K 5K … (or the given ticks), no crowded minor labels."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    f = fmt or _fmt_tokens
    if ticks is not None:
        axis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(set(ticks))))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f(v)))
    axis.set_minor_formatter(NullFormatter())


def _fmt_count(n: float) -> str:
    """Three significant digits: 15.5K, 2.1M."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"


def _fmt_num(v: float) -> str:
    return f"{v:.3g}"


def _panels(n: int, width: float, height: float, **share: Any) -> tuple[Any, list[Any]]:
    """A figure of `n` panels, at most 3 a row, each `width` × `height` inches; the unused
    cells of the last row are hidden. Returns the figure and the `n` axes in order."""
    cols = min(n, 3)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), squeeze=False,
                             constrained_layout=True, **share)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def arm_order(data: StudyData) -> list[str]:
    """Arm names, reference first, as the study lists them; then any other arm with runs."""
    names = [a["name"] for a in (data.tables or {}).get("arms", [])]
    for rec in data.records.values():
        if rec.get("arm") and rec["arm"] not in names:
            names.append(rec["arm"])
    return names


def arm_colors(data: StudyData) -> dict[str, Any]:
    return {a: COLORS[i % len(COLORS)] for i, a in enumerate(arm_order(data))}


def noise_arm_name(data: StudyData) -> str | None:
    floor = (data.tables or {}).get("noise_floor") or []
    return floor[0]["arm"] if floor else None


def _label(data: StudyData, arm: str) -> str:
    for a in (data.tables or {}).get("arms", []):
        if a["name"] == arm:
            return f"{arm} ({a['label']})"
    return arm if arm != noise_arm_name(data) else f"{arm} (noise-floor control)"


# --------------------------------------------------------------------------- training curves


def ema(values: Sequence[float], span: int) -> list[float]:
    """Debiased exponential moving average, α = 2 / (span + 1): m_t = (1 − α) m_{t−1} + α x_t
    from m_0 = 0, divided by 1 − (1 − α)^t so the first points are not pulled to 0."""
    alpha = 2.0 / (span + 1)
    out, m = [], 0.0
    for t, x in enumerate(values, 1):
        m = (1 - alpha) * m + alpha * x
        out.append(m / (1 - (1 - alpha) ** t))
    return out


def smoothing_span(n_points: int) -> int:
    return max(1, round(SMOOTH_FRACTION * n_points))


def run_kind(data: StudyData, run_id: str) -> str:
    """`final`, `noise` (the noise-floor control arm's runs), `sweep` or `live` (not in the
    store yet)."""
    if run_id in data.live:
        return "live"
    rec = data.records.get(run_id, {})
    phases = rec.get("phases") or []
    if rec.get("arm") is not None and rec.get("arm") == noise_arm_name(data) or phases == ["noise"]:
        return "noise"
    return "final" if "final" in phases or "noise" in phases else "sweep"


def draw_loss_curves(data: StudyData) -> Drawn | str:
    """Training loss (smoothed, the raw per-step loss faint behind) and validation loss
    against tokens per run; the noise-floor control arm dashed, sweep runs faint and dotted."""
    if not data.curves:
        return "no run has logged a training step yet (metrics.jsonl)"
    colors = arm_colors(data)
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(12, 5.0), constrained_layout=True)
    order = arm_order(data)

    def key(item: tuple[str, Any]) -> tuple[int, int, str]:
        arm = data.arm_of(item[0])
        kind = run_kind(data, item[0])
        # sweep runs first (underneath), the noise control last (its dashes over the reference)
        return ({"sweep": 0, "final": 1, "live": 1, "noise": 2}[kind],
                order.index(arm) if arm in order else len(order), item[0])

    seen: set[str] = set()
    spans: set[int] = set()
    few_evals = False
    for rid, c in sorted(data.curves.items(), key=key):
        arm = data.arm_of(rid)
        kind = run_kind(data, rid)
        col = colors.get(arm, "grey")
        label = None
        if kind != "sweep" and arm not in seen:
            seen.add(arm)
            label = _label(data, arm)
        ls = "--" if kind == "noise" else (":" if kind == "sweep" else "-")
        if c.tokens:
            span = smoothing_span(len(c.loss))
            smooth = ema(c.loss, span)
            if kind in ("final", "live"):
                spans.add(span)
                ax_t.plot(c.tokens, c.loss, color=col, lw=0.6, alpha=0.22, gid=f"raw:{rid}")
            ax_t.plot(c.tokens, smooth, color=col, ls=ls, lw=0.9 if kind == "sweep" else 1.7,
                      alpha=0.45 if kind == "sweep" else 0.95, label=label, gid=f"smooth:{rid}")
        if c.val_tokens:
            if kind != "sweep" and len(c.val_tokens) < 3:
                few_evals = True
            ax_v.plot(c.val_tokens, c.val_loss, color=col, ls=ls,
                      marker="x" if kind == "sweep" else ("s" if kind == "noise" else "o"),
                      ms=3.5 if kind == "sweep" else 4, lw=0.8 if kind == "sweep" else 1.4,
                      alpha=0.45 if kind == "sweep" else 0.95, mfc="none" if kind == "noise" else col,
                      gid=f"val:{rid}")
    for ax, title in ((ax_t, "training loss (EMA-smoothed; raw per step faint)"), (ax_v, "validation loss")):
        _log_axis(ax)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    if not any(c.val_tokens for c in data.curves.values()):
        ax_v.text(0.5, 0.5, "no validation loss logged yet", ha="center", va="center",
                  transform=ax_v.transAxes, color="grey")
    if data.live:
        ax_t.text(0.01, 0.01, f"{len(data.live)} run(s) still going are drawn as far as they got",
                  transform=ax_t.transAxes, fontsize=8, color="grey")
    handles, labels = ax_t.get_legend_handles_labels()
    handles += [plt.Line2D([], [], color="grey", ls="-", lw=1.7), plt.Line2D([], [], color="grey", lw=0.6, alpha=0.3),
                plt.Line2D([], [], color="grey", ls="--", lw=1.7), plt.Line2D([], [], color="grey", ls=":", alpha=0.6)]
    labels += ["final runs, smoothed", "raw per-step loss", "noise-floor control (dashed)", "LR-sweep runs (dotted)"]
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=4)
    notes = []
    if spans:
        s = sorted(spans)
        notes.append("Training loss: an exponential moving average over "
                     + (f"~{s[0]}" if len(s) == 1 else f"~{s[0]}–{s[-1]}")
                     + " logged steps (5% of each run's), the raw per-step loss faint behind it.")
    if few_evals:
        notes.append("Some final runs were evaluated fewer than 3 times (set train.eval_every for a "
                     "validation curve).")
    return Drawn(fig, notes)


# --------------------------------------------------------------------------- LR sweep


def sweep_points(row: dict[str, Any]) -> tuple[list[tuple[float, float]], list[float], float | None]:
    """((LR, loss − the cell's best) of finished points, LRs that diverged / failed, the best loss)."""
    pts = sorted((float(m), v) for m, v in row["losses"].items())
    ok = [(row["base_lr"] * m, v) for m, v in pts if v is not None]
    best = min((v for _, v in ok), default=None)
    return [(x, v - best) for x, v in ok] if best is not None else [], \
        [row["base_lr"] * m for m, v in pts if v is None], best


def draw_sweep(data: StudyData) -> Drawn | str:
    """Validation loss minus each cell's best against LR, one panel per arm × optimizer, all
    panels on one y scale; the lock marked."""
    if not (data.spec.get("sweep") or {}).get("enabled", True):
        return "the LR sweep is off in this study (every arm trains at its base LR)"
    rows = [r for r in (data.tables or {}).get("sweep", []) if any(v is not None for v in r["losses"].values())]
    if not rows:
        return "no sweep point has finished yet"
    fig, axes = _panels(len(rows), 4.4, 3.6, sharey=True)
    colors = arm_colors(data)
    top = max((d for r in rows for _, d in sweep_points(r)[0]), default=0.0) or 0.01
    floors = {n.get("data", ""): n["size"] for n in (data.tables or {}).get("noise_floor") or []
              if n.get("size") is not None}
    for i, (ax, r) in enumerate(zip(axes, rows)):
        ok, bad, best = sweep_points(r)
        col = colors.get(r["arm"], "C0")
        ax.plot([x for x, _ in ok], [y for _, y in ok], "o-", color=col, gid=f"sweep:{r['arm']}:{r['optimizer']}")
        if bad:
            ax.plot(bad, [top] * len(bad), "x", color="red", ms=9, label="diverged / failed")
        title = f"{r['arm']} · {r['optimizer']}"
        if best is not None:
            title += f"  (best {best:.4f})"
        if r.get("lock") is not None:
            ax.axvline(r["lock"], color="black", ls=":", lw=1)
            at = dict(ok).get(r["lock"])
            if at is not None:
                ax.plot([r["lock"]], [at], "*", color="gold", mec="black", ms=15, zorder=5,
                        label=f"locked LR {r['lock']:g}")
        size = floors.get(r.get("data", ""))
        if size is not None:  # points in the band are not told apart from the best (the noise rule)
            ax.axhspan(0, size, color="#9ca3af", alpha=0.3, lw=0, gid=f"floor:{r['arm']}:{r['optimizer']}",
                       label=f"within the noise floor (F = {nats(size, False)})")
        if r.get("at_edge"):
            title += "\n⚠ never turned: best LR at the sweep's edge"
            ax.set_facecolor("#fff3e0")
        elif r.get("within_floor"):
            title += "\n⚠ lock within the noise floor of the runner-up"
        elif not r.get("done"):
            title += "\n(sweep still running)"
        warn = r.get("at_edge") or r.get("within_floor")
        ax.set_title(title, fontsize=9.5, color="#b45309" if warn else "black")
        _log_axis(ax, fmt=lambda v: f"{v:g}", ticks=[r["base_lr"] * float(m) for m in r["losses"]])
        ax.set_xlabel("learning rate")
        if i % 3 == 0:
            ax.set_ylabel("val loss − the cell's best (nats)")
        ax.axhline(0, color="grey", lw=0.6)
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper center")
    axes[0].set_ylim(-0.05 * top, 1.12 * top)
    notes = ["Every panel shows the validation loss minus its own cell's best, on one shared y "
             "axis, so how flat each arm's optimum is compares directly (each best loss is in "
             "its panel's title)."]
    if floors:
        notes.append("The grey band is the noise floor F above the best: an LR whose point lies in it is not "
                     "told apart from the lock, and a panel whose runner-up lies in it says so.")
    return Drawn(fig, notes)


# --------------------------------------------------------------------------- gaps


def _floor_size(data: StudyData) -> float | None:
    """The noise floor's size F as the study computed it (`sanlab.study.noise`)."""
    floor = (data.tables or {}).get("noise_floor") or []
    return floor[0].get("size") if floor else None


def floor_label(g: dict[str, Any], size: float | None) -> str | None:
    """The bar's annotation: the study table's verdict against the noise floor, without the
    arm ("55× floor", "within noise"); None before there is a floor."""
    verdict = g.get("verdict") or ""
    if "floor yet" in verdict or size is None:
        return None
    m = re.search(r"(\d[\d,.]*×\s*floor)", verdict)
    if m:
        return m.group(1)
    if "noise" in verdict:
        return "within noise"
    return f"{abs(g['mean']) / max(size, 1e-12):.0f}× floor"


def draw_gaps(data: StudyData) -> Drawn | str:
    """Δ per matched arm (mean, sd over seed pairs as error bars, seed pairs as dots), each
    bar labelled with its size in noise floors, the floor's band."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    if not gaps:
        return "no matched pair of final runs has finished yet"
    colors = arm_colors(data)
    fig, ax = plt.subplots(figsize=(min(15.0, max(5.5, 1.1 * len(gaps) + 2.5)), 4.8), constrained_layout=True)
    xs = range(len(gaps))
    size = _floor_size(data)
    lo = min(0.0, *(g["mean"] - (g.get("spread") or 0) for g in gaps), *(v for g in gaps for v in g["per_seed"].values()))
    hi = max(0.0, *(g["mean"] + (g.get("spread") or 0) for g in gaps), *(v for g in gaps for v in g["per_seed"].values()))
    pad = 0.08 * ((hi - lo) or 1.0)
    for x, g in zip(xs, gaps):
        col = colors.get(g["arm"], "C0")
        ax.bar(x, g["mean"], color=col, alpha=0.75, yerr=g.get("spread") or 0, capsize=6,
               error_kw={"lw": 1.2}, gid=f"bar:{g['arm']}:{g['optimizer']}:{g['tokens']}")
        seeds = list(g["per_seed"].values())
        ax.plot([x] * len(seeds), seeds, "o", color="black", ms=4, zorder=4,
                label="seed pairs" if x == 0 else None)
        text = floor_label(g, size)
        if text:
            end = g["mean"] + math.copysign((g.get("spread") or 0) + pad / 3, g["mean"] or 1)
            ax.text(x, end, text, ha="center", va="top" if g["mean"] < 0 else "bottom", fontsize=9,
                    fontweight="bold", gid=f"floor:{g['arm']}:{g['optimizer']}:{g['tokens']}")
    if size is not None:
        ax.axhspan(-size, size, color="grey", alpha=0.3, label=f"noise floor ±{nats(size, False)}", gid="noise-band")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xticks(list(xs))
    multi = len({(g["optimizer"], g["tokens"]) for g in gaps}) > 1
    crowded = len(gaps) > 8
    ax.set_xticklabels([(_arm_role(g).replace("\n", " ") if crowded else _arm_role(g))
                        + ((" " if crowded else "\n") + f"{g['optimizer']} {_fmt_tokens(g['tokens'])}" if multi else "")
                        for g in gaps], fontsize=8 if crowded else 9, rotation=35 if crowded else 0,
                       ha="right" if crowded else "center")
    ax.set_ylabel("Δ val loss (nats)")
    ax.set_title(_delta_title(data), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    notes = []
    if size is not None:
        notes.append(f"Each bar's label is its |Δ| in noise floors (floor = {nats(size, False)} nats, the larger of "
                     "the control pair's mean gap and its seed spread), as the gap table's verdict.")
    return Drawn(fig, notes)


def _arm_role(g: dict) -> str:
    """`iso_param`, or `name (role)` where the role says more than the name."""
    same = g["role"].replace("-", "_").lower() == g["arm"].lower()
    return g["arm"] if same else f"{g['arm']}\n({g['role']})"


def _delta_title(data: StudyData) -> str:
    """The Δ convention as the study table states it ("Δ = … validation loss")."""
    title = ((data.tables or {}).get("titles") or {}).get("gap", "")
    if "Δ =" in title:
        part = title.split("Δ =", 1)[1].split(",")[0].split("(")[0].strip()
        return f"Δ = {part}; error bars: sd over seed pairs"
    return "Δ per matched arm; error bars: sd over seed pairs"


def draw_delta_vs_budget(data: StudyData) -> Drawn | str:
    """Δ against the final token budget per arm (SPEC §1.6: the iso-param gap shrinks)."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    budgets = sorted({g["tokens"] for g in gaps})
    if len((data.spec.get("final") or {}).get("tokens", [])) < 2:
        return "the study has one final token budget (list several in final.tokens for this axis)"
    if len(budgets) < 2:
        return "fewer than two budgets have a finished pair yet"
    fig, ax = plt.subplots(figsize=(8.0, 4.4), constrained_layout=True)
    colors = arm_colors(data)
    order = arm_order(data)
    opts = sorted({g["optimizer"] for g in gaps})
    for arm, opt in sorted({(g["arm"], g["optimizer"]) for g in gaps},
                           key=lambda k: order.index(k[0]) if k[0] in order else 99):
        sel = sorted((g for g in gaps if (g["arm"], g["optimizer"]) == (arm, opt)), key=lambda g: g["tokens"])
        style = ("o-", "s--", "^:")[opts.index(opt) % 3]
        ax.errorbar([g["tokens"] for g in sel], [g["mean"] for g in sel], yerr=[g.get("spread") or 0 for g in sel],
                    fmt=style, capsize=4, color=colors.get(arm, "C0"), label=f"{arm} · {opt}",
                    gid=f"budget:{arm}:{opt}")
    _floor_band(data, ax)
    _log_axis(ax, ticks=budgets)
    ax.set_xlabel("final token budget")
    ax.set_ylabel("Δ val loss (nats)")
    ax.set_title("Δ vs token budget (each arm a series over budgets)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_right(ax)
    return Drawn(fig)


ROLE_MARKERS = {"iso-param": "o", "iso-FLOP": "s", "iso-depth": "^"}


def draw_delta_vs_size(data: StudyData) -> Drawn | str:
    """Δ against the arm's non-embedding parameter count, one point per arm × budget: the
    arms are matched by different criteria, so no line joins them."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    size = {a["name"]: a["params_non_embedding"] for a in (data.tables or {}).get("arms", [])}
    sizes = {size.get(g["arm"]) for g in gaps} - {None}
    if len(sizes) < 2:
        return "the finished arms do not span two model sizes"
    rows = [{**g, "size": size[g["arm"]]} for g in gaps if g["arm"] in size]
    fig, ax = plt.subplots(figsize=(8.0, 4.4), constrained_layout=True)
    colors = arm_colors(data)
    multi = len({(g["optimizer"], g["tokens"]) for g in rows}) > 1
    for g in rows:
        ax.errorbar(g["size"], g["mean"], yerr=g.get("spread") or 0, fmt=ROLE_MARKERS.get(g["role"], "D"),
                    ls="none", capsize=4, ms=8, color=colors.get(g["arm"], "C0"),
                    gid=f"size:{g['arm']}:{g['optimizer']}:{g['tokens']}")
        ax.annotate(g["role"] + (f" · {g['optimizer']} {_fmt_tokens(g['tokens'])}" if multi else ""),
                    (g["size"], g["mean"]), textcoords="offset points", xytext=(7, 5), fontsize=8)
    for arm in sorted({g["arm"] for g in rows}, key=lambda a: size[a]):
        role = next(g["role"] for g in rows if g["arm"] == arm)
        ax.plot([], [], ROLE_MARKERS.get(role, "D"), ls="none", color=colors.get(arm, "C0"),
                label=f"{arm} ({_fmt_count(size[arm])} params)")
    _floor_band(data, ax)
    _log_axis(ax, fmt=_fmt_count, ticks=sorted({g["size"] for g in rows}))
    ax.set_xlabel("arm's non-embedding parameters")
    ax.set_ylabel("Δ val loss (nats)")
    ax.set_title("Δ vs model size: one point per matched arm (not a size series)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_right(ax)
    return Drawn(fig, ["Points, not a line: each arm is matched to the reference by a different criterion "
                       "(parameters, FLOPs, depth), so their sizes are not a ladder of one architecture."])


def _floor_band(data: StudyData, ax: Any) -> None:
    size = _floor_size(data)
    if size is not None:
        ax.axhspan(-size, size, color="grey", alpha=0.3, label=f"noise floor ±{nats(size, False)}", gid="noise-band")
    ax.axhline(0, color="black", lw=0.8, gid="zero")


def _legend_right(ax: Any) -> None:
    """The legend beside the axes, where it never covers a point."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


# --------------------------------------------------------------------------- localisation


def comparison_rows(data: StudyData, grouping: str) -> dict[str, dict[str, dict]]:
    """arm -> group -> {"delta": [Δ per analysed seed pair], "share": [...], "tokens": [...],
    "lo": [...], "hi": [...]} (lo / hi: the per-token bootstrap interval, where the analysis
    has one) for one grouping."""
    out: dict[str, dict[str, dict]] = {}
    for c in data.comparisons():
        v = c.get(grouping)
        rec = data.records.get(c["run"], {})
        if not v or "rows" not in v:
            continue
        arm = f"{rec.get('arm', c['run'])}"
        if rec.get("tokens") and len((data.spec.get("final") or {}).get("tokens", [])) > 1:
            arm += f" {_fmt_tokens(rec['tokens'])}"
        for row in v["rows"]:
            cell = out.setdefault(arm, {}).setdefault(row["group"], {"delta": [], "share": [], "tokens": [],
                                                                      "lo": [], "hi": []})
            if row.get("delta") is not None:
                cell["delta"].append(row["delta"])
                cell["share"].append(row["token_share"])
                cell["tokens"].append(int(row.get("tokens") or 0))
                cell["lo"].append(row.get("delta_lo"))
                cell["hi"].append(row.get("delta_hi"))
    return out


def group_order(data: StudyData, grouping: str, rows: dict[str, dict[str, dict]]) -> list[str]:
    """The groups in the corpus's order (regions fixed; exercise types as the sample lists them)."""
    groups: list[str] = []
    for a in rows:
        groups += [g for g in rows[a] if g not in groups]
    if grouping == "region":
        return sorted(groups, key=lambda g: REGIONS.index(g) if g in REGIONS else 99)
    names = corpus_groups(data, grouping)
    return sorted(groups, key=lambda g: names.index(g) if g in names else len(names))


def corpus_groups(data: StudyData, grouping: str) -> list[str]:
    """Every group the corpus has (exercise types from the analysed sample's data dir)."""
    if grouping == "region":
        return list(REGIONS)
    names: list[str] = []
    for a in data.analyses:
        names += [n for n in (a.get("sample") or {}).get("exercises") or [] if n not in names]
    return names


def group_stats(data: StudyData, grouping: str) -> dict[str, Any]:
    """What the Δ-by-group figure and table show: per arm and group the mean Δ, its error
    (sample sd over ≥ 2 seed pairs, else the per-token bootstrap interval of the one pair),
    the analysed tokens N (the fewest over pairs); the groups below `MIN_GROUP_TOKENS`; the
    corpus's groups absent from every analysed sample."""
    rows = comparison_rows(data, grouping)
    groups = group_order(data, grouping, rows)
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    tokens: dict[str, int] = {}
    for a in rows:
        for g in groups:
            c = rows[a].get(g)
            if not c or not c["delta"]:
                continue
            d = c["delta"]
            m = sum(d) / len(d)
            if len(d) >= 2:
                err: tuple[float, float] | None = (_sd(d), _sd(d))
                kind = "sd"
            elif c["lo"][0] is not None and c["hi"][0] is not None:
                err, kind = (m - c["lo"][0], c["hi"][0] - m), "bootstrap"
            else:
                err, kind = None, "none"
            cells.setdefault(a, {})[g] = {"mean": m, "err": err, "kind": kind, "n_pairs": len(d),
                                          "tokens": min(c["tokens"])}
            tokens[g] = min(tokens.get(g, c["tokens"][0]), min(c["tokens"]))
    absent = [g for g in corpus_groups(data, grouping) if g not in groups] if grouping == "exercise" else []
    return {"arms": list(rows), "groups": groups, "cells": cells, "tokens": tokens,
            "thin": [g for g in groups if tokens.get(g, 0) < MIN_GROUP_TOKENS], "absent": absent,
            "share": {g: _mean([s for a in rows for s in rows[a].get(g, {}).get("share", [])]) for g in groups}}


def draw_grouped_deltas(data: StudyData, grouping: str) -> Drawn | str:
    """Δ per region / exercise type, one bar per arm: the mean over analysed seed pairs, ± their
    sample sd (one pair: the per-token bootstrap interval); N tokens per group under its name;
    groups under `MIN_GROUP_TOKENS` tokens greyed; absent types listed."""
    st = group_stats(data, grouping)
    if not st["arms"]:
        return (f"no paired analysis of the final runs yet (run `sanlab report --analyze` or "
                f"`sanlab analyze ARM --vs REFERENCE --out {data.dir}/analysis/NAME`)")
    arms, groups = st["arms"], st["groups"]
    colors = arm_colors(data)
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(groups) * max(1, len(arms) / 2) + 2), 4.9),
                           constrained_layout=True)
    kinds: set[str] = set()
    for i, a in enumerate(arms):
        for j, g in enumerate(groups):
            c = st["cells"].get(a, {}).get(g)
            if c is None:
                continue
            thin = g in st["thin"]
            x = j - 0.4 + width * (i + 0.5)
            col = "#bbbbbb" if thin else colors.get(a.split(" ")[0], f"C{i}")
            yerr = None if c["err"] is None else [[c["err"][0]], [c["err"][1]]]
            kinds.add(c["kind"])
            ax.bar([x], [c["mean"]], width=width * 0.95, yerr=yerr, capsize=3, color=col, alpha=0.85,
                   hatch="//" if thin else None, edgecolor="#888888" if thin else None,
                   label=a if j == next(k for k, gg in enumerate(groups) if gg in st["cells"].get(a, {})) else None,
                   gid=f"group:{a}:{g}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{g}\nN = {st['tokens'].get(g, 0):,}" + ("\n(too few)" if g in st["thin"] else "")
                        for g in groups], fontsize=8, rotation=0 if len(groups) <= 6 else 30,
                       ha="center" if len(groups) <= 6 else "right")
    for lab, g in zip(ax.get_xticklabels(), groups):
        if g in st["thin"]:
            lab.set_color("#888888")
    ax.set_ylabel("Δ loss on these tokens (nats)")
    err_text = {"sd": "± sd over seed pairs", "bootstrap": "one seed pair: 95% per-token bootstrap interval",
                "none": "no error bar"}
    ax.set_title(f"Δ by {grouping} (arm − reference on the same tokens; mean "
                 + "; ".join(err_text[k] for k in ("sd", "bootstrap", "none") if k in kinds) + ")", fontsize=9.5)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    notes = [f"N is the number of analysed tokens in each group; groups with fewer than {MIN_GROUP_TOKENS} "
             "are grey and hatched" + (f" ({', '.join(st['thin'])})" if st["thin"] else " (none here)") + "."]
    if "bootstrap" in kinds:
        notes.append("With one seed pair the error bar is the 95% per-token bootstrap interval of the group's "
                     "mean Δ (tokens treated as independent: a lower bound on the uncertainty).")
    if st["absent"]:
        absent = ", ".join(st["absent"])
        ax.text(0.99, 0.02, f"not in the analysed sample: {absent}", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=8, color="#b45309", gid="absent")
        notes.append(f"Types of the corpus absent from the analysed sample: {absent}.")
    return Drawn(fig, notes)


def _mean(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else float("nan")


def _sd(v: Sequence[float]) -> float:
    """Sample standard deviation (n − 1): the spread of seed pairs, as the gap table's."""
    if len(v) < 2:
        return 0.0
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


# --------------------------------------------------------------------------- inside the models


def analysed_runs(data: StudyData, key: str) -> list[tuple[str, dict]]:
    """(run id, per-run analysis) of the analysed runs that have `key`, one per arm
    (the lowest seed at the largest budget), reference first."""
    runs = data.analysis_runs()
    order = arm_order(data)
    best: dict[str, tuple[tuple, str]] = {}
    for rid, r in runs.items():
        if not r.get(key):
            continue
        rec = data.records.get(rid, {})
        arm = rec.get("arm", rid)
        rank = (-(rec.get("tokens") or 0), rec.get("seed") or 0)
        if arm not in best or rank < best[arm][0]:
            best[arm] = (rank, rid)
    arms = sorted(best, key=lambda a: order.index(a) if a in order else 99)
    return [(best[a][1], runs[best[a][1]]) for a in arms]


def settled_holds(points: Sequence[tuple[float, float]], milestone: float, tol: float) -> bool:
    """Whether the curve (milestone, mean stable rank) moves by less than `tol` (relative)
    at every step from `milestone` on: the check a "settled" marker must pass."""
    after = [y for x, y in sorted(points) if x >= milestone]
    return all(a != 0 and abs(b - a) / abs(a) < tol for a, b in zip(after, after[1:]))


def type_color(t: str) -> str:
    return TYPE_COLORS.get(t, OTHER_TYPE_COLORS[sum(map(ord, t)) % len(OTHER_TYPE_COLORS)])


def draw_spectra(data: StudyData) -> Drawn | str:
    """Mean stable rank per matrix type across milestones, one panel per arm; where the
    type settled (crystallised) marked, each marker checked against the curve it sits on."""
    runs = analysed_runs(data, "spectra")
    if not runs:
        return "no weight-spectra analysis yet (needs milestone checkpoints and `sanlab analyze`)"
    fig, axes = _panels(len(runs), 4.6, 3.7)
    types = sorted({row["type"] for _, r in runs for row in r["spectra"]["per_type"]},
                   key=lambda t: (list(TYPE_COLORS).index(t) if t in TYPE_COLORS else 99, t))
    dropped: list[str] = []
    tols = set()
    for ax, (rid, r) in zip(axes, runs):
        sp = r["spectra"]
        tol = float(sp.get("tol", 0.02))
        tols.add(tol)
        crystal = {c["type"]: c["milestone"] for c in sp.get("crystallisation", [])}
        rec = data.records.get(rid, {})
        arm = rec.get("arm", rid)
        for t in types:
            pts = sorted((row["milestone"], row["stable_rank"]) for row in sp["per_type"]
                         if row["type"] == t and row.get("stable_rank") is not None)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ls=TYPE_STYLES.get(t, "-"),
                    color=type_color(t), ms=4, label=t, gid=f"type:{arm}:{t}")
            m = crystal.get(t)
            if m is None:
                continue
            y = dict(pts).get(m)
            if y is not None and settled_holds(pts, m, tol):
                ax.plot([m], [y], "D", ms=9, mfc="none", mec=type_color(t), mew=1.8, gid=f"settled:{arm}:{t}")
            else:
                dropped.append(f"{arm} {t} at {m:.0%}")
        ax.set_title(f"{arm} (seed {rec.get('seed', '?')})", fontsize=10)
        ax.set_xlabel("milestone (fraction of training)")
        ax.set_ylabel("mean stable rank")
        ax.set_xlim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        if len({row["milestone"] for row in sp["per_type"]}) < 2:
            ax.text(0.5, 0.08, "one milestone only: add train.milestones for dynamics",
                    transform=ax.transAxes, ha="center", fontsize=8, color="grey")
    handles = [plt.Line2D([], [], color=type_color(t), ls=TYPE_STYLES.get(t, "-"), marker="o", label=t) for t in types]
    handles.append(plt.Line2D([], [], ls="", marker="D", mfc="none", mec="black", label="settled (crystallised)"))
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    tol = max(tols) if tols else 0.02
    notes = [f"Settled: from the marked milestone on, every step between milestones changes the type's spectrum "
             f"shape (total-variation distance of the normalised singular values, mean over layers) by less than "
             f"{tol:g} and its mean stable rank (the curve drawn) by less than {tol:.0%}; a type never marked "
             "has not settled by the last milestone. Matrix types have their own colours (not the arms')."]
    if dropped:
        notes.append("Not marked because the curve still moves after the analysis's settled point (an analysis "
                     f"made before the stable-rank rule; rerun `sanlab analyze`): {', '.join(dropped)}.")
    return Drawn(fig, notes)


def draw_attention(data: StudyData) -> Drawn | str:
    """Heatmaps arm × layer of the per-layer attention metrics (mean over heads), each panel
    on a colour scale from 0 to its largest value."""
    runs = analysed_runs(data, "attention")
    if not runs:
        return "no attention analysis yet (`sanlab analyze` of the final runs)"
    layers = max(len(r["attention"]["layers"]) for _, r in runs)
    labels = [data.records.get(rid, {}).get("arm", rid) for rid, _ in runs]
    import numpy as np

    fig, grid_axes = plt.subplots(2, 2, figsize=(min(16.0, max(10.0, 2.5 + 1.4 * layers)), 1.8 + 1.3 * len(runs)),
                                  constrained_layout=True)
    normalized = any(a.get("attention_normalized") for a in data.analyses)
    for ax, (key, title, _) in zip(grid_axes.flat, ATTENTION_METRICS):
        grid = np.full((len(runs), layers), np.nan)
        for i, (_, r) in enumerate(runs):
            for row in r["attention"]["layers"]:
                v = row.get(key)
                if v is not None:
                    grid[i, int(row["layer"])] = v
        hi = 1.0 if normalized else (float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0)
        hi = hi if hi > 0 else 1.0
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", vmin=0.0, vmax=hi,
                       gid=f"heat:{key}")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1] if layers <= 10 else 0):  # numbers only where they fit
                if not np.isnan(grid[i, j]):
                    v = grid[i, j]
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                            color="white" if v / hi < 0.5 else "black")
        ax.set_title(f"{title} — colour 0 to {hi:.3g}", fontsize=10)
        ax.set_xticks(range(0, layers, 1 if layers <= 12 else 2))
        ax.set_xlabel("layer")
        ax.set_yticks(range(len(runs)))
        ax.set_yticklabels(labels, fontsize=9)
        ax.set_facecolor("#eeeeee")
        fig.colorbar(im, ax=ax, shrink=0.8)
    scale = ("min–max normalised per run (`sanlab analyze --normalize`), colour 0 to 1" if normalized else
             "each panel's colour runs from 0 to its largest value, so equal colours mean equal fractions of it "
             "and nearby values look alike (not a min-to-max stretch)")
    return Drawn(fig, [" ".join(d + "." for _, _, d in ATTENTION_METRICS),
                       f"Colour scale: {scale}; grey cells: the arm has no such layer."])


def gate_reference(residuals: set[str]) -> tuple[float, str] | None:
    """The gates' value at initialisation, drawn as a reference line: σ(0) = 0.5 for gated
    residuals, α = 0 for rezero; None when the models mix kinds or have no gates."""
    if residuals == {"gated"}:
        return 0.5, "σ(0) = 0.5: the gates at initialisation"
    if residuals == {"rezero"}:
        return 0.0, "α = 0: ReZero at initialisation"
    return None


def draw_stream(data: StudyData) -> Drawn | str:
    """Residual-stream RMS after each block and the residual gates per layer, per arm."""
    runs = analysed_runs(data, "stream")
    if not runs:
        return "no residual-stream analysis yet (`sanlab analyze` of the final runs)"
    colors = arm_colors(data)
    fig, (ax_r, ax_g) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    values: list[float] = []
    residuals: set[str] = set()
    for rid, r in runs:
        arm = data.records.get(rid, {}).get("arm", rid)
        col = colors.get(arm, "C0")
        pts = []
        for row in r["stream"]:
            hook = row["hook"]
            if hook.endswith(".resid_post") and row.get("rms") is not None:
                pts.append((int(hook.split(".")[1]), row["rms"]))
        pts.sort()
        if pts:
            ax_r.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=col, ms=4, label=arm, gid=f"rms:{arm}")
        for sub, marker, ls in (("attn", "o", "-"), ("ffn", "s", "--")):
            g = sorted((row["layer"], row[sub]) for row in r.get("gates") or [] if row.get(sub) is not None)
            if g:
                residuals.add(str((r.get("config") or {}).get("residual", "gated")))
                values += [v for _, v in g]
                ax_g.plot([p[0] for p in g], [p[1] for p in g], marker=marker, ls=ls, color=col, ms=4,
                          label=f"{arm} {sub}", gid=f"gate:{arm}:{sub}")
    _log_axis(ax_r, "y", fmt=_fmt_num)
    ax_r.set_xlabel("layer (block output)")
    ax_r.set_ylabel("residual-stream RMS")
    ax_r.set_title("residual-stream RMS per layer", fontsize=10)
    ax_r.grid(alpha=0.3, which="both")
    ax_r.legend(fontsize=8)
    ax_g.set_xlabel("layer")
    ax_g.set_ylabel("gate value (σ(g) or α)")
    ax_g.set_title("residual gates per layer", fontsize=10)
    ax_g.grid(alpha=0.3)
    notes = []
    if values:
        ref = gate_reference(residuals)
        lo, hi = min(values), max(values)
        if ref is not None:
            ax_g.axhline(ref[0], color="black", ls="--", lw=1, label=ref[1], gid="gate-init")
            lo, hi = min(lo, ref[0]), max(hi, ref[0])
            notes.append(f"The dashed line is {ref[1]}; the axis spans at least ±0.1 around it, so a gate "
                         "that barely moved looks it.")
            lo, hi = min(lo, ref[0] - 0.1), max(hi, ref[0] + 0.1)
        pad = 0.05 * (hi - lo or 1.0)
        ax_g.set_ylim(lo - pad, hi + pad)
        ax_g.legend(fontsize=8, ncol=2)
    else:
        ax_g.text(0.5, 0.5, "these models have no residual gates", ha="center", va="center",
                  transform=ax_g.transAxes, color="grey")
    for ax in (ax_r, ax_g):
        ax.xaxis.get_major_locator().set_params(integer=True)
    return Drawn(fig, notes)


# --------------------------------------------------------------------------- the data axis


def axis_points(data: StudyData) -> list[dict[str, Any]]:
    """Per matched arm × data value at the largest final budget (first optimizer): facts
    per non-embedding parameter of the reference (x), and per analysed seed pair the Δ
    over the recall types and over the context-grounded types (`sanlab.analysis.kinds`),
    beside the gap's own per-seed Δ (the store's)."""
    t = data.tables or {}
    axis = t.get("data") or {}
    if not axis.get("key"):
        return []
    ref = next(iter(t.get("arms", [])), {}).get("name")
    x = {r["data"]: r.get("facts_per_param") for r in axis.get("per_arm") or [] if r["arm"] == ref}
    gaps = t.get("gaps", [])
    if not gaps:
        return []
    opt = gaps[0]["optimizer"]
    big = max(g["tokens"] for g in gaps if g["optimizer"] == opt)
    comps = {(c["run"], c["vs"]): c for c in data.comparisons()}
    out = []
    for g in gaps:
        if g["optimizer"] != opt or g["tokens"] != big:
            continue
        recall, context = [], []
        for _, ids in sorted((g.get("runs") or {}).items()):
            c = comps.get((ids["arm"], ids["reference"]))
            if c is None:
                continue
            r, cc = kind_deltas(c)
            if r is not None:
                recall.append(r)
            if cc is not None:
                context.append(cc)
        out.append({"arm": g["arm"], "role": g["role"], "data": g.get("data"), "value": g.get("data_value"),
                    "x": x.get(g.get("data")), "recall": recall, "context": context,
                    "store": list((g.get("per_seed") or {}).values())})
    return out


def draw_delta_vs_axis(data: StudyData) -> Drawn | str:
    """Δ over the recall types and over the context-grounded types against the world's facts
    per parameter (the data axis), per matched arm: the paper's localisation as a curve."""
    pts = [p for p in axis_points(data) if p["x"] is not None and (p["recall"] or p["context"])]
    if not (data.tables or {}).get("data", {}).get("key"):
        return "the study has no data axis (data.axis)"
    if not pts:
        return "no analysed final pairs on the data axis yet (run `sanlab report STUDY --analyze`)"
    fig, ax = plt.subplots(figsize=(8.0, 4.6), constrained_layout=True)
    colors = arm_colors(data)
    arms = list(dict.fromkeys(p["arm"] for p in pts))
    multi = len(arms) > 1
    for arm in arms:
        sel = sorted((p for p in pts if p["arm"] == arm), key=lambda p: p["x"])
        for kind, style, shift in (("recall", "o-", 0.97), ("context", "s--", 1.03)):
            rows = [p for p in sel if p[kind]]
            if not rows:
                continue
            ax.errorbar([p["x"] * shift for p in rows], [_mean(p[kind]) for p in rows],
                        yerr=[_sd(p[kind]) for p in rows], fmt=style, capsize=4,
                        color=colors.get(arm, "C0") if multi else ("C3" if kind == "recall" else "C0"),
                        label=(f"{arm}: " if multi else "") + ("recall types" if kind == "recall"
                                                               else "context-grounded types"),
                        gid=f"axis:{arm}:{kind}")
    sizes = [n["size"] for n in (data.tables or {}).get("noise_floor", []) if n.get("size") is not None]
    if sizes:
        ax.axhspan(-max(sizes), max(sizes), color="grey", alpha=0.3, label=f"noise floor ±{nats(max(sizes), False)}",
                   gid="noise-band")
    ax.axhline(0, color="black", lw=0.8, gid="zero")
    key = (data.tables or {}).get("data", {}).get("key")
    xs = sorted({p["x"] for p in pts})
    names = {p["x"]: p["value"] for p in pts}
    short = str(key).rsplit(".", 1)[-1]

    def tick(v: float) -> str:
        near = min(names, key=lambda x: abs(math.log(x / v))) if v > 0 else None
        return f"{v:.3g}" + (f"\n{short}={names[near]}" if near is not None else "")

    _log_axis(ax, fmt=tick, ticks=xs)
    ax.set_xlabel("world facts per non-embedding parameter (the reference's)")
    ax.set_ylabel("Δ val loss (nats), token-weighted")
    ax.set_title("Δ by exercise kind against facts per parameter (Δ < 0: the standard arm is ahead)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_right(ax)
    return Drawn(fig, ["Error bars: the sd over analysed seed pairs; recall and context-grounded points are "
                       "offset by ±3% in x so their bars do not overlap; the grey band is the largest noise "
                       "floor F over the axis's values."])
