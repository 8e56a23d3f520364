"""Assemble a study's report: figures on disk plus sections of tables, text and placeholders.

The sections are plain data (`Section` holding `Block`s) that `md.py` and `html.py`
render, so report.md and report.html always carry the same tables. Table numbers are
the study's own (`sanlab study table --json`); nothing here recomputes a gap.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sanlab.report import plots
from sanlab.report.data import StudyData
from sanlab.study.noise import nats

BlockKind = Literal["text", "table", "figure", "placeholder", "warning", "code"]


@dataclass
class Block:
    kind: BlockKind
    text: str = ""  # text / placeholder / warning / code body; figure caption; table caption
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    path: Path | None = None  # figure PNG


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def figure(self, fn: Any, data: StudyData, out: Path, name: str, caption: str, *args: Any) -> None:
        """Draw one figure into `out/name` (its caption: `caption` plus the figure's own
        notes), or a placeholder with the reason it is missing."""
        path = out / name
        drawn = fn(data, *args)
        if isinstance(drawn, plots.Drawn):
            plots.save(drawn, path)
            self.blocks.append(Block("figure", " ".join([caption.rstrip(".") + ".", *drawn.notes]), path=path))
        else:
            if path.exists():
                path.unlink()  # a stale figure from an earlier report would contradict the placeholder
            self.blocks.append(Block("placeholder", f"{caption.split(':')[0]}: {drawn}"))


@dataclass
class Report:
    title: str
    sections: list[Section]
    figures: list[Path]


MISSING = "—"  # a value that does not exist (yet)


def _f(v: Any, fmt: str = "{:+.4f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return MISSING
    return fmt.format(v)


def _mean_sd(v: list[float]) -> str:
    """Mean ± the sample standard deviation (n − 1) over analysed seed pairs."""
    if not v:
        return MISSING
    m = sum(v) / len(v)
    if len(v) < 2:
        return f"{m:+.4f}"
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    return f"{m:+.4f} ± {sd:.4f}"


def spec_toml(spec: dict[str, Any]) -> str:
    """The saved spec in the TOML layout it was written in (top-level keys, then sections)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in spec.items() if not isinstance(v, dict)]

    def section(name: str, body: dict[str, Any]) -> None:
        flat = {k: v for k, v in body.items() if not isinstance(v, dict)}
        nested = {k: v for k, v in body.items() if isinstance(v, dict)}
        if flat or not nested:
            lines.append(f"\n[{name}]")
            lines.extend(f"{k} = {json.dumps(v)}" for k, v in flat.items())
        for k, v in nested.items():
            section(f"{name}.{k}", v)

    for k, v in spec.items():
        if isinstance(v, dict):
            section(k, v)
    return "\n".join(lines).strip()


def _tok(n: Any) -> str:
    return plots._fmt_tokens(float(n)) if isinstance(n, (int, float)) else str(n)


# --------------------------------------------------------------------------- sections


def header(data: StudyData) -> Section:
    s = Section("Study")
    counts: dict[str, int] = {}
    # As `study status` counts them (its rows: the store's status, else the run dir's own).
    rows = data.statuses if data.statuses is not None else [{"status": r.get("status", "?"), "in_store": True}
                                                            for r in data.records.values()]
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    counts.pop("pending", None)
    status = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no run finished yet"
    outside = sum(not row["in_store"] and row["status"] != "pending" for row in rows)
    s.blocks.append(Block("text", f"Study **{data.name}** in `{data.dir}`: {len(data.records)} runs "
                                  f"in the results store ({status})." if not outside else
                                  f"Study **{data.name}** in `{data.dir}`: {status}; {outside} of these runs are "
                                  "only in their run dirs, not in the results store (`sanlab study run` records them)."))
    if data.corrupt_lines:
        s.blocks.append(Block("warning", f"results.jsonl: {len(data.corrupt_lines)} corrupt line(s) skipped "
                                         f"(line {', '.join(map(str, data.corrupt_lines[:10]))})"))
    if data.tables_error:
        s.blocks.append(Block("warning", f"the study's tables could not be computed: {data.tables_error}"))
    metas = [m for _, m in sorted(data.metas.items()) if m.get("versions")]
    if metas:
        m = metas[-1]
        v = m.get("versions") or {}
        git = m.get("git") or {}
        dev = m.get("device") or {}
        rows = [["versions", ", ".join(f"{k} {val}" for k, val in v.items())],
                ["git commit", (git.get("commit") or "unknown")[:12] + (" (dirty)" if git.get("dirty") else "")
                 if git else "not a git checkout"],
                ["device", f"{dev.get('type', '?')} · {dev.get('name', '?')} · {dev.get('precision', '?')} · "
                           f"{dev.get('threads', '?')} threads · world size {dev.get('world_size', '?')}"],
                ["host", str(dev.get("hostname", "?"))]]
        commits = {(mm.get("git") or {}).get("commit") for mm in metas}
        if len(commits) > 1:
            rows.append(["note", f"the runs were trained from {len(commits)} different commits"])
        s.blocks.append(Block("table", "Environment (from the run dirs' meta.json)", ["", "value"], rows))
    else:
        s.blocks.append(Block("placeholder", "Environment: no run has written its meta.json yet"))
    arms = (data.tables or {}).get("arms", [])
    tps = (data.tables or {}).get("throughput", {})
    if arms:
        rows = [[a["name"], a["role"], a["label"], plots._fmt_count(a["params_total"]),
                 plots._fmt_count(a["params_non_embedding"]), f"{a['flops_per_token'] / 1e9:.4f}",
                 "—" if a.get("mismatch") is None else f"{a['mismatch']:+.2%}",
                 f"{tps[a['name']]:,.0f}" if a["name"] in tps else MISSING] for a in arms]
        s.blocks.append(Block("table", "Arms, their accounting and the training throughput they ran at "
                                       "(tokens/s per run, mean over finished runs)",
                              ["arm", "role", "config", "params", "non-emb params", "train GFLOPs/token",
                               "mismatch", "tokens/s"], rows))
    s.blocks.append(Block("code", spec_toml(data.spec), columns=["the study spec (study.json, as TOML)"]))
    return s


def curves(data: StudyData, out: Path) -> Section:
    s = Section("Training curves")
    s.figure(plots.draw_loss_curves, data, out, "loss_curves.png",
             "Loss curves: training and validation loss against tokens (log scale); final runs solid, "
             "the noise-floor control arm dashed (its curve lies on the reference's), LR-sweep runs faint "
             "and dotted")
    return s


def sweep(data: StudyData, out: Path) -> Section:
    s = Section("Learning-rate sweep")
    rows = (data.tables or {}).get("sweep", [])
    if rows and (data.spec.get("sweep") or {}).get("enabled", True):
        mults = sorted({float(m) for r in rows for m in r["losses"]})
        table = []
        for r in rows:
            losses = {float(m): v for m, v in r["losses"].items()}
            cells = []
            for m in mults:
                if m not in losses:
                    cells.append("")
                elif losses[m] is None:
                    cells.append("div/fail")
                else:
                    cells.append(f"**{losses[m]:.4f}**" if r.get("best") is not None and m == float(r["best"])
                                 else f"{losses[m]:.4f}")
            lock = MISSING if r.get("lock") is None else f"{r['lock']:g}" + (" (edge!)" if r.get("at_edge") else "")
            table.append([f"{r['arm']} {r['optimizer']}", f"{r['base_lr']:g}", *cells, lock])
        title = ((data.tables or {}).get("titles") or {}).get("sweep") or "LR sweep"
        s.blocks.append(Block("table", title, ["arm × optimizer", "base LR", *(f"{m:g}×" for m in mults), "lock"],
                              table))
    for w in (data.tables or {}).get("sweep_warnings", []):
        s.blocks.append(Block("warning", w.removeprefix("warning: ")))
    s.figure(plots.draw_sweep, data, out, "sweep.png",
             "LR sweep: validation loss against learning rate per arm × optimizer; the star and the "
             "dotted line mark the locked LR, the grey band the noise floor above the cell's best")
    return s


def gap_rows(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """The gap table as the study prints it (same columns, same formatting; with a data
    axis, the value first)."""
    ref = next(iter((data.tables or {}).get("arms", [])), {}).get("name", "reference")
    key = ((data.tables or {}).get("data") or {}).get("key")
    cols = ([key] if key else []) + ["arm", "config", "opt", "tokens", f"{ref} loss", "arm loss", "Δ per seed",
                                     "Δ mean ± sd", "Δ %", "vs noise floor"]
    lead = (lambda g: [str(g.get("data_value"))]) if key else (lambda g: [])
    rows = []
    for g in (data.tables or {}).get("gaps", []):
        rows.append(lead(g) + _gap_row(g, f"{g['arm']} ({g['role']})", g.get("verdict", "")))
    for g in (data.tables or {}).get("noise_floor", []):
        rows.append(lead(g) + _gap_row(g, f"noise floor ({g['arm']} − {ref})", ""))
    return cols, rows


def _gap_row(g: dict, name: str, verdict: str) -> list[str]:
    per = " ".join(f"s{k}: {nats(v)}" for k, v in g["per_seed"].items()) or MISSING
    mean, spread = g.get("mean"), g.get("spread")
    ms = MISSING if mean is None else nats(mean) + ("" if spread is None else f" ± {nats(spread, False)}")
    return [name, g["label"], g["optimizer"], _tok(g["tokens"]), _f(g.get("reference_loss"), "{:.4f}"),
            _f(g.get("arm_loss"), "{:.4f}"), per, ms, _f(g.get("percent"), "{:+.2f}%"), verdict]


def gap(data: StudyData, out: Path) -> Section:
    s = Section("The gap")
    if data.tables is None:
        s.blocks.append(Block("placeholder", "Gap table: the study's tables could not be computed"))
    else:
        cols, rows = gap_rows(data)
        title = (data.tables.get("titles") or {}).get("gap") or "Gap to the reference"
        if rows:
            s.blocks.append(Block("table", title, cols, rows))
        else:
            s.blocks.append(Block("placeholder", "Gap table: no arm has a locked LR yet"))
    s.figure(plots.draw_gaps, data, out, "gaps.png",
             "Δ per matched arm: bars are the mean over seed pairs, error bars their sd, dots the "
             "single seed pairs; the grey band is the noise floor")
    s.figure(plots.draw_delta_vs_budget, data, out, "delta_vs_budget.png",
             "Δ vs token budget: the gap of each arm at every final budget (SPEC §1.6: the iso-param "
             "gap shrinks with tokens)")
    s.figure(plots.draw_delta_vs_size, data, out, "delta_vs_size.png",
             "Δ vs model size: each arm's gap against its non-embedding parameter count")
    return s


def axis(data: StudyData, out: Path) -> Section | None:
    """With a data axis: Δ per arm against it, the world's facts and bits per parameter, and
    Δ by exercise kind against facts per parameter."""
    t = (data.tables or {}).get("data") or {}
    key = t.get("key")
    if not key:
        return None
    s = Section(f"The data axis: {key}")
    s.blocks.append(Block("text", f"Every arm, sweep, seed and noise pair at each value of `{key}` "
                                  f"({', '.join(map(str, t.get('values') or []))}), each value prepared once and "
                                  f"shared by the arms; {t.get('sweep')}."))
    cols = ["arm", "opt", "tokens"] + [f"{key}={v}" for v in t.get("values") or []]
    rows = []
    for r in (data.tables or {}).get("axis", []):
        by = {str(c["data_value"]): c for c in r["values"]}
        cells = []
        for v in t.get("values") or []:
            c = by.get(str(v))
            cells.append(MISSING if c is None or c.get("mean") is None else
                         _f(c["mean"]) + ("" if c.get("spread") is None else f" ± {c['spread']:.4f}")
                         + f" ({c.get('verdict')})")
        rows.append([f"{r['arm']} ({r['role']})", r["optimizer"], _tok(r["tokens"]), *cells])
    if rows:
        s.blocks.append(Block("table", f"Δ = arm − reference against {key} (mean ± sd over seed pairs; the verdict "
                                       "against that value's own noise floor)", cols, rows))
    per = t.get("per_arm") or []
    if per:
        s.blocks.append(Block("table", "Facts and bits of the world per non-embedding parameter (bits: facts × bits "
                                       "per fact, from the generator's distributions)",
                              [key, "arm", "non-emb params", "facts", "bits", "facts/param", "bits/param"],
                              [[str(r["data_value"]), r["arm"], f"{r['params_non_embedding']:,}",
                                MISSING if r["facts"] is None else f"{r['facts']:,}", _f(r["bits"], "{:,.0f}"),
                                _f(r["facts_per_param"], "{:.4f}"), _f(r["bits_per_param"], "{:.4f}")]
                               for r in per]))
    s.figure(plots.draw_delta_vs_axis, data, out, "delta_vs_axis.png",
             "Δ by exercise kind against facts per parameter: the token-weighted Δ over the recall types and over "
             "the context-grounded types of each analysed final pair, mean ± sd over seed pairs")
    return s


def localisation(data: StudyData, out: Path) -> Section:
    s = Section("Where the gap comes from")
    for err in data.analysis_errors:
        s.blocks.append(Block("warning", f"analysis {err}"))
    comps = data.comparisons()
    if comps:
        s.blocks.append(Block("text", "Per-token losses of each final arm and the reference on the same "
                                      "held-out tokens (`sanlab analyze ARM --vs REFERENCE`). Δ = arm − "
                                      "reference per group; the token-weighted group Δs must sum to the "
                                      "aggregate Δ."))
        samples = {(a["sample"].get("rows"), a["sample"].get("seq_len"), a["sample"].get("rows_rule"))
                   for a in data.analyses if isinstance(a.get("sample"), dict)}
        for rows_, seq_len, rule in sorted(samples, key=str):
            s.blocks.append(Block("text", f"Analysed sample: the first {rows_} held-out rows × {seq_len} tokens "
                                          "of the validation order, the same for every run"
                                          + (f" ({rule})." if rule else ".")))
        rows = []
        order = plots.arm_order(data)

        def key(c: dict) -> tuple:
            rec = data.records.get(c["run"], {})
            arm = rec.get("arm", c["run"])
            return (order.index(arm) if arm in order else 99, rec.get("tokens") or 0, rec.get("seed") or 0)

        for c in sorted(comps, key=key):
            rec = data.records.get(c["run"], {})
            reg, ex = c.get("region") or {}, c.get("exercise") or {}
            ri, ei = reg.get("identity") or {}, ex.get("identity") or {}
            rows.append([str(rec.get("arm", c["run"])), _tok(rec.get("tokens", "?")), str(rec.get("seed", "?")),
                         _f(ri.get("aggregate_delta")), _f(ri.get("weighted_sum")),
                         _f(ri.get("rel_error"), "{:.1e}"), _f(ei.get("weighted_sum")),
                         _f(ei.get("rel_error"), "{:.1e}"), _f(c.get("recorded_val_delta"))])
        s.blocks.append(Block("table", "Token-weighted identity check per analysed pair: the group Δs weighted "
                                       "by token share must sum to the aggregate Δ on the sample "
                                       "(recorded val Δ: the runs' own validation set)",
                              ["arm", "tokens", "seed", "aggregate Δ", "Σ share·Δ (regions)", "rel. error",
                               "Σ share·Δ (exercises)", "rel. error", "recorded val Δ"], rows))
        for grouping in ("region", "exercise"):
            cr = plots.comparison_rows(data, grouping)
            st = plots.group_stats(data, grouping)
            groups = st["groups"]
            table = [[a, *(_mean_sd(cr[a].get(g, {}).get("delta", [])) for g in groups)] for a in cr]
            if table:
                table.append(["N tokens", *(f"{st['tokens'].get(g, 0):,}" + (" (too few)" if g in st["thin"] else "")
                                             for g in groups)])
                caption = (f"Δ by {grouping}, nats (mean ± sample sd over analysed seed pairs; N: analysed tokens "
                           f"per group, fewer than {plots.MIN_GROUP_TOKENS} marked too few)")
                if st["absent"]:
                    caption += f"; absent from the analysed sample: {', '.join(st['absent'])}"
                s.blocks.append(Block("table", caption, ["arm", *groups], table))
    s.figure(plots.draw_grouped_deltas, data, out, "delta_by_region.png",
             "Δ by region (query / trace / answer / other)", "region")
    s.figure(plots.draw_grouped_deltas, data, out, "delta_by_exercise.png",
             "Δ by exercise type", "exercise")
    return s


def inside(data: StudyData, out: Path) -> Section:
    s = Section("Inside the models")
    s.figure(plots.draw_spectra, data, out, "spectra.png",
             "Weight spectra: mean stable rank ‖W‖²_F/‖W‖²₂ per matrix type across milestone "
             "checkpoints; a hollow diamond marks where the type settled (crystallised)")
    s.figure(plots.draw_attention, data, out, "attention.png",
             "Attention metrics per layer (mean over heads) for one final run per arm")
    s.figure(plots.draw_stream, data, out, "stream.png",
             "Residual stream: RMS of each block's output and the residual gates per layer")
    return s


def build(data: StudyData, out: Path) -> Report:
    """Draw every figure into `out` and return the report's sections."""
    out.mkdir(parents=True, exist_ok=True)
    ax = axis(data, out)
    sections = [header(data), curves(data, out), sweep(data, out), gap(data, out), *([ax] if ax else []),
                localisation(data, out), inside(data, out)]
    figures = [b.path for s in sections for b in s.blocks if b.kind == "figure" and b.path is not None]
    return Report(f"sanlab report — study {data.name}", sections, figures)
