"""The report's figures: matplotlib with the Agg backend, one PNG per figure.

Each `plot_*` function takes the study's plain data and a path; it writes the PNG and
returns None, or returns the reason it has nothing to draw (the report shows that
reason as the section's placeholder). Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from sanlab.report.data import StudyData  # noqa: E402

DPI = 110
COLORS = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
REGIONS = ("query", "trace", "answer", "other")


def _save(fig: Figure, path: Path) -> None:
    """Write the PNG atomically (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=DPI, format="png")
    plt.close(fig)
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


def _panels(n: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of `n` panels, at most 3 a row, each `width` × `height` inches; the unused
    cells of the last row are hidden. Returns the figure and the `n` axes in order."""
    cols = min(n, 3)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), squeeze=False,
                             constrained_layout=True)
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


def _label(data: StudyData, arm: str) -> str:
    for a in (data.tables or {}).get("arms", []):
        if a["name"] == arm:
            return f"{arm} ({a['label']})"
    return arm


# --------------------------------------------------------------------------- training curves


def plot_loss_curves(data: StudyData, path: Path) -> str | None:
    """Train loss against tokens per arm (log x); final runs solid, sweep runs faint."""
    if not data.curves:
        return "no run has logged a training step yet (metrics.jsonl)"
    colors = arm_colors(data)
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(12, 5.0), constrained_layout=True)
    seen: set[str] = set()
    vals = False
    order = arm_order(data)

    def key(item: tuple[str, Any]) -> tuple[int, str]:
        arm = data.records.get(item[0], {}).get("arm")
        return (order.index(arm) if arm in order else len(order), item[0])

    for rid, c in sorted(data.curves.items(), key=key):
        rec = data.records.get(rid, {})
        arm = data.arm_of(rid)
        final = any(p in ("final", "noise") for p in rec.get("phases", [])) or rid in data.live
        noise_only = rec.get("phases") == ["noise"]
        col = colors.get(arm, "grey")
        label = _label(data, arm) if final and arm not in seen else None
        if label:
            seen.add(arm)
        if c.tokens:
            ax_t.plot(c.tokens, c.loss, color=col, lw=1.4 if final else 0.8,
                      alpha=0.9 if final else 0.35, ls=(":" if noise_only else "-") if final else "--",
                      label=label)
        if c.val_tokens:
            vals = True
            ax_v.plot(c.val_tokens, c.val_loss, color=col, marker="o" if final else "x",
                      ms=5 if final else 4, alpha=0.9 if final else 0.4, ls="-" if final else ":",
                      lw=1.2 if final else 0.8)
    val_ticks = sorted({t for c in data.curves.values() for t in c.val_tokens})
    for ax, title in ((ax_t, "training loss (per step)"), (ax_v, "validation loss")):
        few = ax is ax_v and 0 < len(val_ticks) <= 8
        _log_axis(ax, fmt=_fmt_count if few else None, ticks=val_ticks if few else None)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    if not vals:
        ax_v.text(0.5, 0.5, "no validation loss logged yet", ha="center", va="center",
                  transform=ax_v.transAxes, color="grey")
    if data.live:
        ax_t.text(0.01, 0.01, f"{len(data.live)} run(s) still going are drawn as far as they got",
                  transform=ax_t.transAxes, fontsize=8, color="grey")
    handles, labels = ax_t.get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="grey", ls="--", alpha=0.5))
    labels.append("sweep runs (faint, dashed)")
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=min(len(labels), 4))
    _save(fig, path)
    return None


# --------------------------------------------------------------------------- LR sweep


def plot_sweep(data: StudyData, path: Path) -> str | None:
    """Validation loss against LR per arm × optimizer: the U-curves, lock marked."""
    rows = (data.tables or {}).get("sweep", [])
    if not (data.spec.get("sweep") or {}).get("enabled", True):
        return "the LR sweep is off in this study (every arm trains at its base LR)"
    rows = [r for r in rows if any(v is not None for v in r["losses"].values())]
    if not rows:
        return "no sweep point has finished yet"
    fig, axes = _panels(len(rows), 4.4, 3.6)
    colors = arm_colors(data)
    for ax, r in zip(axes, rows):
        pts = sorted((float(m), v) for m, v in r["losses"].items())
        ok = [(r["base_lr"] * m, v) for m, v in pts if v is not None]
        bad = [r["base_lr"] * m for m, v in pts if v is None]
        col = colors.get(r["arm"], "C0")
        ax.plot([x for x, _ in ok], [y for _, y in ok], "o-", color=col)
        if bad:
            top = max(y for _, y in ok) if ok else 0
            ax.plot(bad, [top] * len(bad), "x", color="red", ms=9, label="diverged / failed")
        title = f"{r['arm']} · {r['optimizer']}"
        if r.get("lock") is not None:
            ax.axvline(r["lock"], color="black", ls=":", lw=1)
            best = dict(ok).get(r["lock"])
            if best is None and r.get("best") is not None:
                best = dict((float(m), v) for m, v in r["losses"].items()).get(float(r["best"]))
            if best is not None:
                ax.plot([r["lock"]], [best], "*", color="gold", mec="black", ms=15, zorder=5,
                        label=f"locked LR {r['lock']:g}")
        if r.get("at_edge"):
            title += "\n⚠ never turned: best LR at the sweep's edge"
            ax.set_facecolor("#fff3e0")
        elif not r.get("done"):
            title += "\n(sweep still running)"
        ax.set_title(title, fontsize=10, color="#b45309" if r.get("at_edge") else "black")
        _log_axis(ax, fmt=lambda v: f"{v:g}", ticks=[r["base_lr"] * float(m) for m in r["losses"]])
        ax.set_xlabel("learning rate")
        ax.set_ylabel("val loss")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    _save(fig, path)
    return None


# --------------------------------------------------------------------------- gaps


def _floor_size(data: StudyData) -> float | None:
    """The noise floor's size F as the study computed it (`sanlab.study.noise`)."""
    floor = (data.tables or {}).get("noise_floor") or []
    return floor[0].get("size") if floor else None


def plot_gaps(data: StudyData, path: Path) -> str | None:
    """Δ per matched arm (mean, sd over seed pairs as error bars, seed pairs as dots), noise band."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    if not gaps:
        return "no matched pair of final runs has finished yet"
    colors = arm_colors(data)
    fig, ax = plt.subplots(figsize=(min(15.0, max(5.5, 1.1 * len(gaps) + 2.5)), 4.6), constrained_layout=True)
    xs = range(len(gaps))
    for x, g in zip(xs, gaps):
        col = colors.get(g["arm"], "C0")
        ax.bar(x, g["mean"], color=col, alpha=0.75, yerr=g.get("spread") or 0, capsize=6,
               error_kw={"lw": 1.2})
        seeds = list(g["per_seed"].values())
        ax.plot([x] * len(seeds), seeds, "o", color="black", ms=4, zorder=4,
                label="seed pairs" if x == 0 else None)
    size = _floor_size(data)
    if size is not None:
        ax.axhspan(-size, size, color="grey", alpha=0.2, label=f"noise floor ±{size:.4f}")
    ax.axhline(0, color="black", lw=0.8)
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
    _save(fig, path)
    return None


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


def plot_delta_vs_budget(data: StudyData, path: Path) -> str | None:
    """Δ against the final token budget per arm (SPEC §1.6: the iso-param gap shrinks)."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    budgets = sorted({g["tokens"] for g in gaps})
    if len((data.spec.get("final") or {}).get("tokens", [])) < 2:
        return "the study has one final token budget (list several in final.tokens for this axis)"
    if len(budgets) < 2:
        return "fewer than two budgets have a finished pair yet"
    return _delta_line(data, gaps, path, key="tokens", xlabel="final token budget",
                       title="Δ vs token budget")


def plot_delta_vs_size(data: StudyData, path: Path) -> str | None:
    """Δ against the arm's non-embedding parameter count, where the arms differ in size."""
    gaps = [g for g in (data.tables or {}).get("gaps", []) if g.get("mean") is not None]
    size = {a["name"]: a["params_non_embedding"] for a in (data.tables or {}).get("arms", [])}
    sizes = {size.get(g["arm"]) for g in gaps} - {None}
    if len(sizes) < 2:
        return "the finished arms do not span two model sizes"
    rows = [{**g, "size": size[g["arm"]]} for g in gaps if g["arm"] in size]
    fig, ax = plt.subplots(figsize=(8.0, 4.4), constrained_layout=True)
    colors = arm_colors(data)
    markers = "os^Dv<>p"
    for k, (opt, tokens) in enumerate(sorted({(g["optimizer"], g["tokens"]) for g in rows})):
        sel = sorted((g for g in rows if (g["optimizer"], g["tokens"]) == (opt, tokens)), key=lambda g: g["size"])
        ax.plot([g["size"] for g in sel], [g["mean"] for g in sel], "-", color="grey", lw=0.8, zorder=1)
        ax.plot([], [], markers[k % len(markers)], color="grey", ls="-", label=f"{opt} {_fmt_tokens(tokens)}")
        for g in sel:
            ax.errorbar(g["size"], g["mean"], yerr=g.get("spread") or 0, fmt=markers[k % len(markers)],
                        capsize=4, color=colors.get(g["arm"], "C0"))
    for arm in sorted({g["arm"] for g in rows}, key=lambda a: size[a]):
        ax.plot([], [], "s", color=colors.get(arm, "C0"), label=f"{arm} ({_fmt_count(size[arm])} params)")
    _floor_band(data, ax)
    _log_axis(ax, fmt=_fmt_count, ticks=sorted({g["size"] for g in rows}))
    ax.set_xlabel("arm's non-embedding parameters")
    ax.set_ylabel("Δ val loss (nats)")
    ax.set_title("Δ vs model size (arms of this study)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_right(ax)
    _save(fig, path)
    return None


def _floor_band(data: StudyData, ax: Any) -> None:
    size = _floor_size(data)
    if size is not None:
        ax.axhspan(-size, size, color="grey", alpha=0.2, label=f"noise floor ±{size:.4f}")
    ax.axhline(0, color="black", lw=0.8)


def _legend_right(ax: Any) -> None:
    """The legend beside the axes, where it never covers a point."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _delta_line(data: StudyData, gaps: list[dict], path: Path, *, key: str, xlabel: str,
                title: str) -> str | None:
    fig, ax = plt.subplots(figsize=(8.0, 4.4), constrained_layout=True)
    colors = arm_colors(data)
    for (arm, opt) in sorted({(g["arm"], g["optimizer"]) for g in gaps}, key=lambda k: arm_order(data).index(k[0])
                             if k[0] in arm_order(data) else 99):
        sel = sorted((g for g in gaps if (g["arm"], g["optimizer"]) == (arm, opt)), key=lambda g: g[key])
        opts = sorted({g["optimizer"] for g in gaps})
        style = ("o-", "s--", "^:")[opts.index(opt) % 3]
        ax.errorbar([g[key] for g in sel], [g["mean"] for g in sel], yerr=[g.get("spread") or 0 for g in sel],
                    fmt=style, capsize=4, color=colors.get(arm, "C0"), label=f"{arm} · {opt}")
    _floor_band(data, ax)
    _log_axis(ax, ticks=sorted({g[key] for g in gaps}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Δ val loss (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    _legend_right(ax)
    _save(fig, path)
    return None


# --------------------------------------------------------------------------- localisation


def comparison_rows(data: StudyData, grouping: str) -> dict[str, dict[str, dict]]:
    """arm -> group -> {"delta": [Δ per analysed seed pair], "share": [...]} for one grouping."""
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
            cell = out.setdefault(arm, {}).setdefault(row["group"], {"delta": [], "share": []})
            if row.get("delta") is not None:
                cell["delta"].append(row["delta"])
                cell["share"].append(row["token_share"])
    return out


def plot_grouped_deltas(data: StudyData, path: Path, grouping: str) -> str | None:
    """Δ per region / exercise type, one bar per arm, mean over analysed seed pairs ± sd."""
    rows = comparison_rows(data, grouping)
    if not rows:
        return (f"no paired analysis of the final runs yet (run `sanlab report --analyze` or "
                f"`sanlab analyze ARM --vs REFERENCE --out {data.dir}/analysis/NAME`)")
    arms = list(rows)
    groups: list[str] = []
    for a in arms:
        groups += [g for g in rows[a] if g not in groups]
    if grouping == "region":
        groups.sort(key=lambda g: REGIONS.index(g) if g in REGIONS else 99)
    colors = arm_colors(data)
    width = 0.8 / len(arms)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(groups) * max(1, len(arms) / 2) + 2), 4.6),
                           constrained_layout=True)
    for i, a in enumerate(arms):
        xs, ms, sds = [], [], []
        for j, g in enumerate(groups):
            d = rows[a].get(g, {}).get("delta", [])
            if d:
                xs.append(j - 0.4 + width * (i + 0.5))
                ms.append(sum(d) / len(d))
                sds.append(_sd(d))
        ax.bar(xs, ms, width=width * 0.95, yerr=sds, capsize=3, color=colors.get(a.split(" ")[0], f"C{i}"),
               alpha=0.8, label=a)
    ax.axhline(0, color="black", lw=0.8)
    share = {g: _mean([s for a in arms for s in rows[a].get(g, {}).get("share", [])]) for g in groups}
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{g}\n{share[g]:.1%} of tokens" for g in groups], fontsize=8,
                       rotation=0 if len(groups) <= 6 else 30, ha="center" if len(groups) <= 6 else "right")
    ax.set_ylabel("Δ loss on these tokens (nats)")
    ax.set_title(f"Δ by {grouping} (arm − reference, paired on the same tokens; "
                 "mean ± sd over analysed seed pairs)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    return None


def _mean(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else float("nan")


def _sd(v: Sequence[float]) -> float:
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


def plot_spectra(data: StudyData, path: Path) -> str | None:
    """Mean stable rank per matrix type across milestones, one panel per arm; crystallisation marked."""
    runs = analysed_runs(data, "spectra")
    if not runs:
        return "no weight-spectra analysis yet (needs milestone checkpoints and `sanlab analyze`)"
    fig, axes = _panels(len(runs), 4.6, 3.7)
    types = sorted({row["type"] for _, r in runs for row in r["spectra"]["per_type"]})
    tcol = {t: COLORS[i % len(COLORS)] for i, t in enumerate(types)}
    for ax, (rid, r) in zip(axes, runs):
        sp = r["spectra"]
        crystal = {c["type"]: c["milestone"] for c in sp.get("crystallisation", [])}
        for t in types:
            pts = sorted((row["milestone"], row["stable_rank"]) for row in sp["per_type"]
                         if row["type"] == t and row.get("stable_rank") is not None)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=tcol[t], ms=4, label=t)
            m = crystal.get(t)
            if m is not None:
                y = dict(pts).get(m)
                if y is not None:
                    ax.plot([m], [y], "D", ms=9, mfc="none", mec=tcol[t], mew=1.8)
        rec = data.records.get(rid, {})
        ax.set_title(f"{rec.get('arm', rid)} (seed {rec.get('seed', '?')})", fontsize=10)
        ax.set_xlabel("milestone (fraction of training)")
        ax.set_ylabel("mean stable rank")
        ax.set_xlim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        if len({p for row in sp["per_type"] for p in [row["milestone"]]}) < 2:
            ax.text(0.5, 0.08, "one milestone only: add train.milestones for dynamics",
                    transform=ax.transAxes, ha="center", fontsize=8, color="grey")
    handles = [plt.Line2D([], [], color=tcol[t], marker="o", label=t) for t in types]
    handles.append(plt.Line2D([], [], ls="", marker="D", mfc="none", mec="black", label="crystallised (settled)"))
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    _save(fig, path)
    return None


ATTENTION_METRICS = (("entropy", "entropy (nats)"), ("sink", "sink mass"),
                     ("local_0", "local focus (nearest bucket)"), ("head_diversity", "head diversity"))


def plot_attention(data: StudyData, path: Path) -> str | None:
    """Heatmaps arm × layer of the per-layer attention metrics (mean over heads)."""
    runs = analysed_runs(data, "attention")
    if not runs:
        return "no attention analysis yet (`sanlab analyze` of the final runs)"
    layers = max(len(r["attention"]["layers"]) for _, r in runs)
    labels = [data.records.get(rid, {}).get("arm", rid) for rid, _ in runs]
    import numpy as np

    fig, grid_axes = plt.subplots(2, 2, figsize=(min(16.0, max(10.0, 2.5 + 1.4 * layers)), 1.6 + 1.3 * len(runs)),
                                  constrained_layout=True)
    axes = list(grid_axes.flat)
    for ax, (key, title) in zip(axes, ATTENTION_METRICS):
        grid = np.full((len(runs), layers), np.nan)
        for i, (_, r) in enumerate(runs):
            for row in r["attention"]["layers"]:
                v = row.get(key)
                if v is not None:
                    grid[i, int(row["layer"])] = v
        masked = np.ma.masked_invalid(grid)
        im = ax.imshow(masked, aspect="auto", cmap="viridis")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1] if layers <= 10 else 0):  # numbers only where they fit
                if not np.isnan(grid[i, j]):
                    v = grid[i, j]
                    lo, hi = np.nanmin(grid), np.nanmax(grid)
                    dark = hi > lo and (v - lo) / (hi - lo) < 0.5
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(0, layers, 1 if layers <= 12 else 2))
        ax.set_xlabel("layer")
        ax.set_yticks(range(len(runs)))
        ax.set_yticklabels(labels, fontsize=9)
        ax.set_facecolor("#eeeeee")
        fig.colorbar(im, ax=ax, shrink=0.8)
    _save(fig, path)
    return None


def plot_stream(data: StudyData, path: Path) -> str | None:
    """Residual-stream RMS after each block and the residual gates per layer, per arm."""
    runs = analysed_runs(data, "stream")
    if not runs:
        return "no residual-stream analysis yet (`sanlab analyze` of the final runs)"
    colors = arm_colors(data)
    fig, (ax_r, ax_g) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    gated = False
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
            ax_r.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=col, ms=4, label=arm)
        for sub, marker, ls in (("attn", "o", "-"), ("ffn", "s", "--")):
            g = sorted((row["layer"], row[sub]) for row in r.get("gates") or [] if row.get(sub) is not None)
            if g:
                gated = True
                ax_g.plot([p[0] for p in g], [p[1] for p in g], marker=marker, ls=ls, color=col, ms=4,
                          label=f"{arm} {sub}")
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
    if gated:
        ax_g.legend(fontsize=8, ncol=2)
    else:
        ax_g.text(0.5, 0.5, "these models have no residual gates", ha="center", va="center",
                  transform=ax_g.transAxes, color="grey")
    for ax in (ax_r, ax_g):
        ax.xaxis.get_major_locator().set_params(integer=True)
    _save(fig, path)
    return None


