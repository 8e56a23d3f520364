"""`sanlab probe TASK [--arms a,b,…] [key=value …]` and `sanlab probe --suite [--quick]`.

    sanlab probe retrieval --arms standard,san
    sanlab probe modadd --arms standard task.p=59 train.steps=2000
    sanlab probe capacity --arms standard capacity.ns=[256,1024]
    sanlab probe --suite --quick --out runs/probes

Every (task, arm) cell gets its own LR sweep with boundary extension; the printed
numbers are exact-match accuracy on held-out test examples (training set for
memorization) at the LR the validation split selected. See docs/commands/probe.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from sanlab.cliargs import ArgumentParser
from sanlab.errors import ConfigError
from sanlab.paths import check_out_dir
from sanlab.probes.arms import PRESETS, Arm, available_presets, check_available, resolve_arms, unavailable
from sanlab.tables import Output, add_format_flag

DEFAULT_OUT = Path("runs/probe")


def configure(parser: argparse.ArgumentParser, *, intermixed: bool = False) -> None:
    # Options may come after the task and the overrides (`probe retrieval --arms standard
    # train.steps=100`): argparse's plain parse cannot mix a `*` positional with options,
    # so the items take the remainder and `run` parses that remainder again, intermixed.
    parser.add_argument("items", nargs="*" if intermixed else argparse.REMAINDER, metavar="[TASK] [key=value]",
                        help="the task (`sanlab probe --list` shows them), then overrides: model.* optim.* "
                             "train.* task.* sweep.* capacity.* runner.*")
    parser.add_argument("--suite", action="store_true", help="run every task for every arm and print the grid")
    parser.add_argument("--tasks", metavar="T,U,…",
                        help="with --suite: these tasks only, comma-separated (default: every task; the "
                             "grid keeps SPEC §2's column order)")
    parser.add_argument("--quick", action="store_true", help="small task sizes and budgets (minutes on a CPU)")
    parser.add_argument("--arms", metavar="A,B,…",
                        help="arm presets, comma-separated (default: standard,san for one task; every "
                             "preset this build has for --suite)")
    parser.add_argument("--arm", action="append", default=[], metavar="'NAME: key=value …'",
                        help="a custom arm: a name and run-config overrides (repeatable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"data, runs and results go here (default {DEFAULT_OUT}); reruns reuse finished runs")
    parser.add_argument("--merge", action="append", default=[], type=Path, metavar="SRC",
                        help="with --suite: add the suite in SRC (another --out dir, e.g. other tasks run "
                             "elsewhere) to --out's and write the whole suite there; no training (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the tasks and arm presets and exit")
    add_format_flag(parser)


def _list(console: object) -> int:
    from sanlab.data.probes import TASKS  # lazy: numpy; `sanlab probe --help` runs without it

    print("tasks:")
    for name, t in TASKS.items():
        print(f"  {name:<10} {t.description}" + ("" if t.suite else "   (not in --suite's columns)"))
        for c in t.readings:
            print(f"  {c.name:<10} {c.description}")
    print("arms:")
    for name, ov in PRESETS.items():
        why = unavailable(Arm(name, ov))
        print(f"  {name:<10} {' '.join(ov)}" + ("   (not available in this build)" if why else ""))
    return 0


def _merge(args: argparse.Namespace, console: Output) -> int:
    from sanlab.probes.merge import merge  # lazy: numpy (via the suite's runner); `--help` runs without it
    from sanlab.probes.suite import print_cells, print_table  # lazy: numpy, as above

    if not args.suite:
        raise ConfigError("--merge joins suites: give it with --suite")
    extra = [flag for flag, given in (("--tasks", args.tasks is not None), ("--arms", args.arms is not None),
                                      ("--arm", bool(args.arm)), ("--quick", args.quick),
                                      (" ".join(args.items), bool(args.items))) if given]
    if extra:
        raise ConfigError(f"--merge trains nothing and takes the pieces as they are: drop {extra[0]}")
    check_out_dir(args.out)
    res = merge(args.merge, args.out, log=lambda m: console.note(m))
    print_cells(res, console)
    print_table(res, console)
    console.close()
    return 0


def _reparse(args: argparse.Namespace) -> argparse.Namespace:
    """Options given after the first positional item, parsed from the remainder."""
    if not any(i.startswith("-") for i in args.items):
        return args
    parser = ArgumentParser(prog="sanlab probe", add_help=False, exit_on_error=False)  # its path checks too
    configure(parser, intermixed=True)
    try:
        again = parser.parse_intermixed_args(args.items)
    except argparse.ArgumentError as e:
        raise ConfigError(str(e)) from None
    for key in ("suite", "quick", "list"):
        setattr(again, key, getattr(again, key) or getattr(args, key))
    again.arms = again.arms if again.arms is not None else args.arms
    again.tasks = again.tasks if again.tasks is not None else args.tasks
    again.arm = [*args.arm, *again.arm]
    again.merge = [*args.merge, *again.merge]
    again.out = again.out if again.out != DEFAULT_OUT else args.out
    again.format = again.format if again.format != "text" else args.format
    return again


def run(args: argparse.Namespace) -> int:
    args = _reparse(args)
    console = Output(args.format)
    if args.list:
        return _list(console)
    # lazy: torch, numpy; `sanlab probe --help` runs without them, `--list` without torch
    from sanlab.data.probes import TASKS
    from sanlab.probes.runner import Overrides, run_cells
    from sanlab.probes.layout import task_of
    from sanlab.probes.merge import carried, join
    from sanlab.probes.suite import (CAPACITY, SUITE_TASKS, build_cells, print_cells, print_table, results,
                                     write_data, write_results)

    if args.merge:
        return _merge(args, console)
    tasks_given = [i for i in args.items if "=" not in i]
    ov = Overrides.parse([i for i in args.items if "=" in i])
    if args.suite:
        if tasks_given:
            raise ConfigError(f"--suite runs every task; drop {tasks_given[0]!r} (or drop --suite)")
        tasks = list(SUITE_TASKS)
        if args.tasks is not None:
            chosen = [t.strip() for t in args.tasks.split(",") if t.strip()]
            unknown = [t for t in chosen if t not in SUITE_TASKS]
            if unknown or not chosen:
                raise ConfigError(f"--tasks: unknown suite task {unknown[0]!r} (choose from "
                                  f"{', '.join(SUITE_TASKS)})" if unknown else "--tasks: give at least one task")
            tasks = [t for t in SUITE_TASKS if t in chosen]
    else:
        if args.tasks is not None:
            raise ConfigError("--tasks goes with --suite (one task: give it as TASK)")
        if not tasks_given:
            raise ConfigError("give a TASK (or --suite); `sanlab probe --list` shows them")
        if len(tasks_given) > 1:
            raise ConfigError(f"one TASK at a time, got {' '.join(tasks_given)} (or use --suite)")
        task = tasks_given[0]
        if task not in TASKS and task != CAPACITY:
            raise ConfigError(f"unknown probe task {task!r} (choose from {', '.join([*TASKS, CAPACITY])})")
        tasks = [task]
    if args.arms is not None or args.arm:
        arms = resolve_arms(args.arms.split(",") if args.arms else [], args.arm)
        check_available(arms)
    elif args.suite:
        arms = available_presets()
        skipped = [n for n in ("frozen_qk", "frozen_mlp", "mixit") if n not in {a.name for a in arms}]
        if skipped:
            console.note(f"arms: {', '.join(a.name for a in arms)} ({', '.join(skipped)}: not available "
                         "in this build)")
    else:
        arms = resolve_arms(["standard", "san"])
    opts = ov.options_model(args.quick)
    # One validation step before anything is written: the --out location, every task
    # config, every task's data (generated in memory) and every arm's run config. Only
    # then are the --out dir and the data dirs created.
    check_out_dir(args.out)
    out = Path(os.path.abspath(args.out))  # the runs train in their run dirs: no path may be cwd-relative
    cells = build_cells(tasks, arms, ov, opts, args.quick, out)
    out.mkdir(parents=True, exist_ok=True)
    write_data(cells)
    t0 = time.time()
    stem = "suite" if args.suite else f"probe-{tasks[0]}"
    console.progress(f"{len(cells)} cell(s): {', '.join(tasks)} × {', '.join(a.name for a in arms)}; "
                  f"{opts.runner.workers} worker(s) × {opts.runner.threads} thread(s) → {out}")

    arm_dicts = [{"name": a.name, "label": a.label, "overrides": list(a.overrides)} for a in arms]
    kept = carried(out, arm_dicts, args.quick, tasks, log=console.note) if args.suite else []

    def gathered() -> dict[str, Any]:
        """This run's cells, with the cells of the tasks the dir's suite.json had and this run has not."""
        res = results(tasks, arms, cells, quick=args.quick, out=out, wall_s=time.time() - t0)
        if not kept:
            return res
        return join([*tasks, *map(task_of, kept)], arm_dicts, [*res["cells"], *kept], quick=args.quick,
                    wall_s=res["wall_s"])

    def save_so_far() -> None:
        write_results(gathered(), out, stem)

    def on_round(n: int, runs: int) -> None:
        console.progress(f"round {n}: {runs} run(s)" + (" (boundary extension)" if n > 1 else ""))

    def progress(cell: object, point: object, done: int) -> None:
        c, p = cell, point
        te = "—" if p.test_accuracy is None else f"{100 * p.test_accuracy:.1f}%"
        va = "—" if p.val_accuracy is None else f"{100 * p.val_accuracy:.1f}%"
        err = f" — {p.error}" if p.error else ""
        console.progress(f"  [{done}] {c.key} lr {p.lr:.3g} (×{p.multiplier:g}): {p.status}  val {va}  test {te}  "
                      f"({p.wall_s or 0:.0f} s, {time.time() - t0:.0f} s in all){err}")
        save_so_far()  # a stopped suite keeps every finished run's numbers in its results

    run_cells(cells, opts, out, progress, on_round, save_so_far)
    res = gathered()
    print_cells(res, console)
    print_table(res, console)
    json_path, csv_path = write_results(res, out, stem)
    console.note(f"wrote {json_path} and {csv_path} ({res['wall_s']:.0f} s)")
    failed = [p for c in cells for p in c.points.values() if p.status not in ("completed", "diverged")]
    if failed:
        console.note(f"{len(failed)} run(s) failed; rerun the same command to retry them", style="red")
    console.close()
    return 1 if failed else 0

