"""`sanlab study plan|run|status|table`: a controlled study from one spec file.

The command line of `sanlab.study`; it lives with the other commands because `run
--report` and `status` reach the report (`sanlab.report`), a layer above the study."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sanlab.config import format_tokens
from sanlab.errors import EXIT_OK, ConfigError
from sanlab.matching import layer_map, model_label
from sanlab.paths import check_in_path, check_out_dir, is_run_dir
from sanlab.report.analyze_job import side_work
from sanlab.report.cli import REPORT_DIR, make_report
from sanlab.study.orchestrate import Study, check, load_saved_spec
from sanlab.study.plan import build_arms, data_points, plan_study
from sanlab.study.results import run_rows, table_json
from sanlab.study.speed import arm_speeds, local_threads
from sanlab.study.spec import load_spec
from sanlab.study.store import ResultStore
from sanlab.study.table import locks_by_point, print_tables
from sanlab.tables import Cell, Output, Table, add_format_flag, refuse_json_and_format

_EPILOG = """\
examples:
  sanlab study plan examples/quick.toml
  sanlab study plan examples/paper.toml --json
  sanlab study run examples/quick.toml --out runs/quick runner.workers=2
  sanlab study status runs/quick
  sanlab study table runs/quick
Spec keys can be overridden as section.key=value after the spec file.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("plan", help="every run the study will do, with its cost")
    p.add_argument("spec", help="study spec (TOML)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--out", help="a study dir whose results refine the plan (locked LRs)")
    p.add_argument("--json", action="store_true", help="machine-readable plan")
    add_format_flag(p)
    p.add_argument("--no-timing", action="store_true",
                   help="do not time the arms' training steps (local runner); scale "
                        "runner.tokens_per_s by FLOPs per token instead")
    r = sub.add_parser("run", help="run (or continue) the study in a study dir")
    r.add_argument("spec", help="study spec (TOML)")
    r.add_argument("overrides", nargs="*", metavar="key=value")
    r.add_argument("--out", required=True, help="the study dir (rerun to resume)")
    r.add_argument("--extend", action="store_true",
                   help="let the spec add arms, seeds or final budgets to the dir's study "
                        "(never change a run it has); without it another spec is refused")
    r.add_argument("--report", action="store_true",
                   help="then analyse the final pairs and write the report (as `sanlab report DIR --analyze`)")
    s = sub.add_parser("status", help="progress of a study dir")
    s.add_argument("dir")
    s.add_argument("--json", action="store_true", help="the runs and counts as JSON data")
    add_format_flag(s)
    t = sub.add_parser("table", help="the gap table and the LR sweep table of a study dir")
    t.add_argument("dir")
    t.add_argument("--json", action="store_true", help="the gaps, noise floor, sweep and locks as JSON data")
    add_format_flag(t)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _plan(args: argparse.Namespace) -> int:
    if args.out:  # the timing caches speed.json there
        check_out_dir(args.out)
    spec = load_spec(args.spec, args.overrides)
    _, points = check(spec, Path(args.out) if args.out else None)  # exactly what `study run` refuses
    records: dict[str, Any] = ResultStore(args.out).runs() if args.out else {}
    plan = plan_study(spec, args.out, records)
    if records:
        plan = plan_study(spec, args.out, records,
                          point_locks=locks_by_point(spec, plan.arms, records, set(records), points))
    if spec.runner.kind == "local" and not args.no_timing:
        plan.speeds, notes = arm_speeds(plan.runs, local_threads(spec.runner), args.out,
                                        side_by_side=spec.runner.workers)
        plan.notes += notes
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return EXIT_OK
    out = Output(args.format)
    if spec.data.axis:
        dt = Table(f"Data axis {spec.data.axis_key} (each value prepared once, shared by every arm)")
        for col in ("value", "run-id prefix", "prepared dir"):
            dt.column(col)
        for p in points:
            ready = (Path(p.dir) / "manifest.json").is_file()
            dt.add_row(str(p.value), p.slug, p.dir + ("" if ready else " (to prepare)"))
        out.table(dt)
    arms = Table(f"Arms of study '{spec.name}' (T={spec.data.seq_len})")
    for col in ("arm", "role", "config", "total params", "non-emb params", "train GFLOPs/token", "mismatch"):
        arms.column(col, "left" if col in ("arm", "role", "config") else "right")
    for a in plan.arms:
        arms.add_row(a.name, a.role, a.label, Cell(_fmt_params(a.params_total), a.params_total),
                     Cell(_fmt_params(a.params_non_embedding), a.params_non_embedding),
                     f"{a.flops_per_token / 1e9:.4f}",
                     Cell("—" if a.mismatch is None else f"{a.mismatch:+.2%}", None if a.mismatch is None else 100 * a.mismatch))
    for a in plan.arms:  # a hybrid or mixed layout: which layers are which
        if (where := layer_map(a.model)) is not None:
            arms.notes.append(f"{a.name}: {where}")
    out.table(arms)
    ext = plan.max_extension_runs
    runs = Table(f"{len(plan.runs)} runs" + (f" + up to {ext} sweep extensions" if ext else ""))
    numeric = ("params", "GFLOPs/tok", "tokens", "lr", "seed", "PFLOPs", "est. time")
    for col in ("run id", "phase", "arm", "config", *numeric, "note"):
        runs.column(col, "right" if col in numeric else "left")
    for r in plan.runs:
        runs.add_row(r.run_id, r.phase, r.arm, model_label(r.config.model),
                     Cell(_fmt_params(r.params_total), r.params_total),
                     f"{r.flops_per_token / 1e9:.4f}", Cell(format_tokens(r.tokens), r.tokens), f"{r.lr:g}",
                     str(r.seed), f"{r.flops_per_token * r.tokens / 1e15:.3g}",
                     Cell(_fmt_seconds(plan.run_seconds(r)), fields={"s": plan.run_seconds(r)}), r.note)
    out.table(runs)
    total_s = plan.total_seconds
    if spec.runner.kind == "local" and spec.runner.members != 1 and not spec.runner.gpus_per_run:
        # lazy: the grouping reads the run configs with the trainer's resolution (torch)
        from sanlab.study.groups import plan_seconds, plan_table_rows

        total_s = plan_seconds(plan, spec.runner.members, spec.runner.workers)
        rows = plan_table_rows(plan, spec.runner.members, spec.runner.workers)
        if rows:
            gt = Table(f"Member groups (runner.members = {spec.runner.members}): each trains as one batched model")
            for col in ("phase", "members", "runs", "est. time"):
                gt.column(col, "right" if col in ("members", "est. time") else "left")
            for phase, ids, secs in rows:
                gt.add_row(phase, str(len(ids)), ", ".join(ids), Cell(_fmt_seconds(secs), fields={"s": secs}))
            gt.notes.append("a group's time: its process's start, once, + its runs' times without it summed / "
                            "the measured members speed-up (sanlab/study/groups.py); runner.members = 1 trains "
                            "every run on its own")
            out.table(gt)
    for note in plan.notes:
        out.note(f"note: {note}")
    how = ("each arm's training step timed on this machine (start-up, steps and evaluations; "
           "`--no-timing` to skip)" if plan.speeds else
           f"{plan.tokens_per_s:g} tokens/s for the reference arm (runner.tokens_per_s; other arms "
           "scaled by FLOPs/token)")
    ext_s = plan.extension_seconds
    upto = f" (up to {_fmt_seconds(total_s + ext_s)} with every extension)" if ext and ext_s else ""
    out.note(f"total: {len(plan.runs)} runs" + (f" + up to {ext} sweep extensions" if ext else "")
             + f", {plan.total_flops:.3g} FLOPs; about {_fmt_seconds(total_s)}{upto} "
             f"with {plan.workers} run(s) in parallel, from {how}")
    out.close()
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    if is_run_dir(out):
        raise ConfigError(f"--out {out}: is a training run dir (it holds config.json / meta.json), "
                          "not a study dir; give the study a directory of its own")
    spec = load_spec(args.spec, args.overrides)
    rc = Study(spec, out, extend=args.extend, side_work=side_work(out) if args.report else None).run()
    if args.report:
        html, _ = make_report(out, analyze=True)
        print(html)
    return rc


def _status(args: argparse.Namespace) -> int:
    spec = load_saved_spec(args.dir)
    store = ResultStore(args.dir)
    _note_damaged(store)
    rows = [{k: v for k, v in row.items() if k != "in_store"} for row in run_rows(spec, args.dir, store.runs())]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    report_file = Path(args.dir) / REPORT_DIR / "report.html"
    report = str(report_file) if report_file.is_file() else None
    if args.json:
        print(json.dumps({"runs": rows, "counts": counts, "report": report}, indent=2))
        return EXIT_OK
    out = Output(args.format)
    table = Table(f"Study '{spec.name}' in {args.dir}")
    for col in ("run id", "phase", "status", "val loss", "wall", "note"):
        table.column(col, "right" if col in ("val loss", "wall") else "left")
    for row in rows:
        table.add_row(row["run_id"], row["phase"], row["status"],
                      "" if row["val_loss"] is None else f"{row['val_loss']:.4f}",
                      Cell("" if row["wall_s"] is None else _fmt_seconds(row["wall_s"]), fields={"s": row["wall_s"]}),
                      row["note"])
    out.table(table)
    out.note(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if report is not None:
        out.note(f"report: {report}")
    out.close()
    return EXIT_OK


def _note_damaged(store: Any) -> None:
    """A results line the store skips is named on stderr; the command still answers."""
    bad = store.damaged()
    if bad:
        print(f"note: {store.path}: {len(bad)} damaged line(s) skipped (line {', '.join(map(str, bad[:10]))}); "
              "`sanlab study run` moves them to results.jsonl.torn", file=sys.stderr)


def _table(args: argparse.Namespace) -> int:
    store = ResultStore(args.dir)
    if args.json:
        tables = table_json(args.dir)
        _note_damaged(store)
        print(json.dumps(tables, indent=2))
        return EXIT_OK
    spec = load_saved_spec(args.dir)
    _note_damaged(store)
    with Output(args.format) as out:
        print_tables(spec, build_arms(spec), store.runs(), data_points(spec, args.dir), out, store.data())
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    refuse_json_and_format(args)
    if args.action in ("status", "table"):  # a name over the filesystem's limits, a symlink loop: one line
        check_in_path(args.dir, "STUDY_DIR")
    return {"plan": _plan, "run": _run, "status": _status, "table": _table}[args.action](args)
