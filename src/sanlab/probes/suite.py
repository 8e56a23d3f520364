"""The variants × tasks grid (SPEC §2): cells, results, the table, JSON and CSV.

Computing and printing are apart: `results(...)` builds one JSON-able dict that the
table, `suite.json` / `probe-TASK.json` and the CSV are all rendered from.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from sanlab.data.probes import columns
from sanlab.fileio import try_read_json_object
from sanlab.tables import Output, Table

from sanlab.probes.arms import LABELS, Arm
from sanlab.probes.capacity import capacity, trainable_from_meta
from sanlab.probes.layout import CAPACITY, task_of
from sanlab.probes.runner import Cell, Overrides, ProbeOptions, check_run_config, make_cell, task_settings

# SPEC §2's columns, in its order, with their headings and the paper's numbers: what each
# task file declares (sanlab.data.probes); language modelling is `sanlab study`'s business.
SUITE_TASKS: tuple[str, ...] = tuple(c.name for c in columns() if c.suite)
COLUMNS: dict[str, str] = {c.name: c.label for c in columns()}


def _anchors() -> dict[str, dict[str, float | str]]:
    """SPEC §2 anchors per arm and column: accuracy in %, capacity in bits/param; "≈ standard"
    where the paper says so."""
    out: dict[str, dict[str, float | str]] = {}
    for c in columns():
        for arm, number in c.paper.items():
            out.setdefault(arm, {})[c.name] = number
    return out


ANCHORS = _anchors()


def build_cells(tasks: Sequence[str], arms: Sequence[Arm], ov: Overrides, opts: ProbeOptions,
                quick: bool, out: Path) -> list[Cell]:
    """Every cell with its task config, data layout and run config, all checked; nothing
    written (`write_data` writes the data dirs). Every task config and every run config
    that does not depend on the data is checked before any task's data is generated."""
    specs: list[tuple[str, str, Arm, Any, list[str]]] = []  # key, task, arm, task config, run items
    for task in tasks:
        for arm in arms:
            if task == CAPACITY:
                for n in opts.capacity.ns:
                    cfg, run_items = task_settings("memorize", quick, [*ov.task, f"n_train={n}"])
                    specs.append((f"capacity-n{n}/{arm.name}", "memorize", arm, cfg,
                                  [*run_items, *opts.capacity.model]))
            else:
                cfg, run_items = task_settings(task, quick, ov.task)
                specs.append((f"{task}/{arm.name}", task, arm, cfg, run_items))
    for _, _, arm, _, run_items in specs:
        check_run_config(arm, run_items, ov.run)
    planned: dict[Path, Any] = {}
    return [make_cell(key, task, arm, cfg, run_items, ov.run, opts, out, planned)
            for key, task, arm, cfg, run_items in specs]


def write_data(cells: Sequence[Cell]) -> None:
    """Write each planned data dir once (a dir already there is reused as it is)."""
    seen: set[Path] = set()
    for c in cells:
        if c.data.out not in seen:
            seen.add(c.data.out)
            c.data.write()


def _meta(run_dir: Path | None) -> dict[str, Any]:
    if run_dir is None:
        return {}
    return try_read_json_object(Path(run_dir) / "meta.json") or {}


def results(tasks: Sequence[str], arms: Sequence[Arm], cells: Sequence[Cell], *, quick: bool,
            out: Path | None = None, wall_s: float | None = None) -> dict[str, Any]:
    """Everything the table, JSON and CSV show. The cells' run dirs are relative to `out`
    (the --out dir; None: as they are)."""
    summaries = []
    for c in cells:
        s = c.summary()
        best = c.best()
        meta = _meta(Path(out or "") / best.run_dir if best else None)
        s["trainable_params"] = trainable_from_meta(meta) if meta else None
        s["params"] = (meta.get("accounting") or {}).get("params_module") if meta else None
        summaries.append(s)
    return assemble(tasks, [{"name": a.name, "label": a.label, "overrides": list(a.overrides)} for a in arms],
                    summaries, quick=quick, wall_s=wall_s)


def assemble(tasks: Sequence[str], arms: Sequence[dict[str, Any]], summaries: Sequence[dict[str, Any]], *,
             quick: bool, wall_s: float | None) -> dict[str, Any]:
    """The results dict from the cells' summaries (`Cell.summary()` with the trainable
    parameter counts): the grid, the capacity arithmetic, the anchors, the unscored cells."""
    names = [a["name"] for a in arms]
    table: dict[str, dict[str, Any]] = {a: {} for a in names}
    caps: dict[str, Any] = {}
    unscored: dict[str, dict[str, Any]] = {a: {} for a in names}
    for a in names:
        for task in tasks:
            mine = [s for s in summaries if s["arm"] == a and task_of(s) == task]
            why = _unscored(mine)
            if why is not None:
                unscored[a][task] = why
            if task == CAPACITY:
                params = next((s["trainable_params"] for s in mine if s["trainable_params"]), None)
                alphabet = mine[0]["task_config"]["alphabet"] if mine else None
                points = [{"n": s["task_config"]["n_train"], "memorised": s["test_correct"]} for s in mine]
                cap = capacity(points, alphabet, params) if params and alphabet else {"bits_per_param": None}
                fano = (capacity(points, alphabet, params, measure="fano") if params and alphabet
                        else {"bits_per_param": None})
                caps[a] = {**cap, "alphabet": alphabet, "points": points, "fano": fano}
                table[a][task] = cap["bits_per_param"]
            elif mine:
                acc = mine[0]["test_accuracy"]
                table[a][task] = None if acc is None else 100.0 * acc
    return {
        "quick": quick, "tasks": list(tasks), "arms": [dict(a) for a in arms],
        "table": table, "capacity": caps, "anchors": {a: ANCHORS.get(a, {}) for a in table},
        "unscored": {a: v for a, v in unscored.items() if v}, "cells": list(summaries), "wall_s": wall_s,
    }


def _unscored(mine: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Why a column of an arm has no number: none of its cells selected an LR, because
    their runs failed (`{"status": "failed", "error": the first cell's first error}`) or
    all diverged. None when some cell has a result or none has run yet."""
    ran = [s for s in mine if any(p.get("status") for p in s["points"])]
    if not ran or len(ran) < len(mine) or any(s["lr"] is not None for s in ran):
        return None
    errors = [s["error"] for s in ran if s.get("error")]
    if errors:
        return {"status": "failed", "error": (str(errors[0]).splitlines() or [""])[0]}
    return {"status": "diverged", "error": None}


def _fmt(value: Any, task: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, str):
        return value
    return f"{value:.2f}" if task == CAPACITY else f"{value:.1f}"


def _fmt_capacity(cap: dict[str, Any]) -> str:
    """bits/param, with `≥` when every pair of the best N was memorised (a lower bound)."""
    text = _fmt(cap.get("bits_per_param"), CAPACITY)
    return ("≥" + text) if cap.get("lower_bound") and text != "—" else text


def print_table(res: dict[str, Any], console: Output | Console) -> None:
    """Arms × tasks (test exact-match accuracy in %, capacity in bits/param), then SPEC §2's anchors."""
    console = console if isinstance(console, Output) else Output.to_console(console)
    tasks = res["tasks"]
    edge = {(s["arm"], s["key"].split("/")[0]) for s in res["cells"] if s["at_edge"]}
    t = Table("probe suite: test exact-match accuracy (%), memorization in bits/param")
    t.column("arm")
    for task in tasks:
        t.column(COLUMNS.get(task, task), "right")
    unscored = res.get("unscored") or {}
    for a in res["arms"]:
        row = []
        for task in tasks:
            why = (unscored.get(a["name"]) or {}).get(task)
            if why is not None:  # no LR selected: no number, and no edge to speak of
                row.append(why["status"])
                continue
            cell = (_fmt_capacity(res["capacity"].get(a["name"], {})) if task == CAPACITY
                    else _fmt(res["table"][a["name"]].get(task), task))
            at_edge = any(k[0] == a["name"] and (k[1] == task or (task == CAPACITY and k[1].startswith("capacity-")))
                          for k in edge)
            row.append(cell + ("*" if at_edge else ""))
        t.add_row(a["label"], *row)
    console.table(t)
    for name, whys in unscored.items():
        for task, why in whys.items():
            what = (f"every run failed; the first error: {why['error']}" if why["status"] == "failed"
                    else "every run diverged")
            console.note(f"{COLUMNS.get(task, task)} / {LABELS.get(name, name)}: {what}", style="red")
    if any(s["at_edge"] for s in res["cells"]):
        console.note("* the selected LR is still at an edge of its sweep (the sweep hit sweep.max_extensions)")
    if any(c.get("lower_bound") for c in res["capacity"].values()):
        console.note("≥ every pair of the largest N was memorised: a lower bound (add a larger N to capacity.ns)")
    anchors = [(a, res["anchors"].get(a["name"]) or {}) for a in res["arms"]]
    if any(v for _, v in anchors):
        p = Table("SPEC §2 anchors (paper)")
        p.column("arm")
        for task in tasks:
            p.column(COLUMNS.get(task, task), "right")
        for a, v in anchors:
            if v:
                p.add_row(LABELS.get(a["name"], a["name"]), *[_fmt(v.get(task), task) for task in tasks])
        console.table(p)
    if res["capacity"]:
        for name, cap in res["capacity"].items():
            pts = ", ".join(f"N={p['n']}: {p['memorised']}" for p in cap["points"])
            if cap.get("bits_per_param") is not None:
                console.note(f"capacity {name}: {cap['bits_per_param']:.3f} bits/param = {cap['memorised']} labels "
                              f"× log2({cap['alphabet']}) / {cap['params']:,} trainable params (best N={cap['n']}, "
                              f"{cap['chance']:.0f} of them expected by chance; memorised {pts})"
                              + (" — a lower bound" if cap.get("lower_bound") else ""))
                fano = cap.get("fano") or {}
                if fano.get("bits_per_param") is not None:
                    console.note(f"capacity {name}, chance removed (Fano): {fano['bits_per_param']:.3f} bits/param = "
                                  f"{fano['bits']:,.0f} bits / {fano['params']:,} (best N={fano['n']})"
                                  + (" — a lower bound" if fano.get("lower_bound") else ""))


def print_cells(res: dict[str, Any], console: Output | Console) -> None:
    """One line per cell: the locked LR, val / test accuracy, trainable parameters."""
    console = console if isinstance(console, Output) else Output.to_console(console)
    t = Table("per arm: LR locked by the sweep, exact-match accuracy")
    for col in ("task", "arm", "lr (×base)", "val acc", "test acc", "correct", "trainable params"):
        t.column(col, "left" if col in ("task", "arm") else "right")
    for s in res["cells"]:
        lr = "—" if s["lr"] is None else f"{s['lr']:.3g} (×{s['multiplier']:g})" + ("*" if s["at_edge"] else "")
        if s["lr"] is None and s.get("error"):
            lr = "failed"
        va, te = s["val_accuracy"], s["test_accuracy"]
        t.add_row(s["key"].split("/")[0], s["label"], lr, "—" if va is None else f"{100 * va:.1f}%",
                  "—" if te is None else f"{100 * te:.1f}%",
                  "—" if s["test_correct"] is None else f"{s['test_correct']}/{s['test_total']}",
                  "—" if s["trainable_params"] is None else f"{s['trainable_params']:,}")
    console.table(t)


def _csv_num(value: Any) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.6g}"


def csv_text(res: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["arm", "label", "task", "metric", "value", "paper", "lr", "multiplier", "at_edge",
                "correct", "total", "trainable_params"])
    by_key = {(s["arm"], s["key"].split("/")[0]): s for s in res["cells"]}
    for a in res["arms"]:
        for task in res["tasks"]:
            value = res["table"][a["name"]].get(task)
            paper = (res["anchors"].get(a["name"]) or {}).get(task, "")
            if task == CAPACITY:
                cap = res["capacity"].get(a["name"], {})
                w.writerow([a["name"], a["label"], task, "bits_per_param", _csv_num(value),
                            paper, "", "", "", cap.get("memorised", ""), cap.get("n", ""), cap.get("params", "")])
                fano = cap.get("fano") or {}
                w.writerow([a["name"], a["label"], task, "bits_per_param_fano", _csv_num(fano.get("bits_per_param")),
                            "", "", "", "", fano.get("memorised", ""), fano.get("n", ""), fano.get("params", "")])
                continue
            s = by_key.get((a["name"], task), {})
            w.writerow([a["name"], a["label"], task, "test_accuracy_pct", _csv_num(value),
                        paper, s.get("lr", ""), s.get("multiplier", ""), s.get("at_edge", ""),
                        s.get("test_correct", ""), s.get("test_total", ""), s.get("trainable_params", "")])
    return buf.getvalue()


def _clean(value: Any) -> Any:
    """Strict JSON: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_results(res: dict[str, Any], out: Path, stem: str) -> tuple[Path, Path]:
    """`{stem}.json` and `{stem}.csv` in `out`, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / f"{stem}.json", out / f"{stem}.csv")
    texts = (json.dumps(_clean(res), indent=2, allow_nan=False) + "\n", csv_text(res))
    for path, text in zip(paths, texts):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths
