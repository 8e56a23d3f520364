"""`sanlab eval RUN_DIR [RUN_DIR …] --tasks t1,t2 [--limit N] [--checkpoint NAME]`

Zero-shot evaluation with lm-evaluation-harness (`pip install 'sanlab[eval]'`), in
process, through the `sanlab` model (`sanlab.eval.adapter`). `--tasks` takes any
lm-eval task or group name (lambada_openai, sciq, arc_easy, piqa, hellaswag,
winogrande, mmlu, … — downloaded by lm-eval as usual) and `builtin`, the offline tasks
sanlab writes for each run (`sanlab.eval.builtin`). Each run's results go to
`RUN_DIR/eval/results-<checkpoint>.json` (merged with earlier tasks, written
atomically); a runs × tasks table is printed. A `--limit N` evaluation (a quick look at
the first N examples) goes to its own `results-<checkpoint>-limit<N>.json`, marked
`"limit": N`, so it never replaces a full evaluation's numbers, and the table says so.
For the built-in recall tasks lm-eval logs each item's outcome, and the task's metrics
gain the stored bits counted from them (`recall_metrics`, `sanlab.eval.builtin.stored_bits`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from sanlab.errors import ConfigError, SanlabError
from sanlab.tables import Output, Table, add_format_flag

# the metric shown in the table, by task (first found); the JSON keeps every metric
_SHOWN = {"sanlab_kjv_ppl": ("bits_per_byte",), "sanlab_cloze": ("acc", "perplexity")}
_DEFAULT_SHOWN = ("acc", "exact_match", "bits_per_byte", "word_perplexity", "perplexity")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to evaluate")
    parser.add_argument("--tasks", required=True, metavar="T1,T2",
                        help="comma-separated lm-eval task names; 'builtin' = the offline tasks")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="at most N examples per task")
    parser.add_argument("--checkpoint", default="latest", metavar="NAME",
                        help="checkpoint: latest, milestone-050 or 50 (default latest)")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="prepared data dir holding the runs' tokenizer (default: each run's data.dir)")
    parser.add_argument("--batch-size", type=int, default=16, metavar="ROWS",
                        help="packed rows of seq_len tokens per forward pass (default 16)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument("--bootstrap-iters", type=int, default=1000, metavar="N",
                        help="bootstrap resamples for the stderr of non-mean metrics such as perplexity "
                             "(lm-eval's default is 100000; default here 1000)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show lm-eval's own log and progress bars (default: sanlab's own output only)")
    add_format_flag(parser)


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise SanlabError("sanlab eval needs lm-evaluation-harness: pip install 'sanlab[eval]'") from None


def _task_list(text: str) -> tuple[list[str], bool]:
    """The requested names with `builtin` expanded, and whether any lm-eval task is asked for."""
    from sanlab.eval.builtin import BUILTIN_TASKS  # lazy: torch, numpy; `sanlab eval --help` runs without them

    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ConfigError("--tasks: give at least one task name")
    out: list[str] = []
    for n in names:
        out += list(BUILTIN_TASKS) if n == "builtin" else [n]
    out = list(dict.fromkeys(out))
    return out, any(n not in BUILTIN_TASKS for n in out)


def _quiet(verbose: bool) -> None:
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:
        os.environ.setdefault("TQDM_DISABLE", "1")
        for name in ("lm_eval", "lm-eval", "datasets", "sanlab.eval"):
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            import datasets

            datasets.utils.logging.disable_progress_bar()
            datasets.utils.logging.set_verbosity_error()
        except ImportError:
            pass


def _metrics(task_result: dict[str, Any]) -> dict[str, float]:
    """lm-eval's 'acc,none' / 'acc_stderr,none' keys as {'acc': …, 'acc_stderr': …}."""
    out = {}
    for key, value in task_result.items():
        if "," in key and isinstance(value, (int, float)):
            metric, filt = key.split(",", 1)
            out[metric if filt == "none" else f"{metric}[{filt}]"] = float(value)
    return out


@contextlib.contextmanager
def _lm_eval_output(verbose: bool) -> Iterator[None]:
    """lm-eval's own chatter (its `print`s such as "bootstrapping for stddev", progress
    bars, dataset builder lines) held back unless `verbose`; shown on stderr if the
    evaluation fails, so a failure keeps its context."""
    if verbose:
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue()[-4000:])
        raise


def _unknown_task(name: str, known: int) -> ConfigError:
    return ConfigError(f"--tasks: unknown task {name!r} (lm-eval knows {known} tasks; "
                       "list them with `lm-eval ls tasks`)")


def check_task_names(tasks: list[str], verbose: bool = False) -> Any:
    """Refuse a task name lm-eval does not know before anything is written (the built-in
    tasks' files included); returns lm-eval's task index (None when only built-in tasks
    are asked for, which need no index)."""
    from sanlab.eval.builtin import BUILTIN_TASKS  # lazy: torch, numpy (as above)

    asked = [t for t in tasks if t not in BUILTIN_TASKS]
    if not asked:
        return None
    from lm_eval.tasks import TaskManager

    with _lm_eval_output(verbose):
        manager = TaskManager(include_defaults=True)
    unknown = [t for t in asked if t not in manager.all_tasks]
    if unknown:
        raise _unknown_task(unknown[0], len(manager.all_tasks))
    return manager


def evaluate_run(path: Path, tasks: list[str], needs_defaults: bool, args: argparse.Namespace,
                 out: Any = None, defaults: Any = None) -> dict[str, Any]:
    """Run the tasks on one run dir; write and return its results record. Notes and
    warnings go to `out` (a `sanlab.tables.Output`; stdout when None). `defaults` is
    lm-eval's task index from `check_task_names`, reused where no built-in task is asked."""
    # lazy: lm-eval is optional (`sanlab eval` without it says how to install it); torch
    import lm_eval
    import lm_eval.evaluator
    from lm_eval.tasks import TaskManager

    from sanlab.accounting import count_params
    from sanlab.eval.adapter import SanlabLM
    from sanlab.eval.builtin import BUILTIN_TASKS, RECALL_TASKS, write_builtin_tasks
    from sanlab.eval.run import open_run
    from sanlab.train.rundir import read_json, write_json

    say = out.note if out is not None else print
    loaded = open_run(path, args.checkpoint, args.data, args.device)
    eval_dir = loaded.run.path / "eval"
    task_dir = eval_dir / "tasks"
    builtin_record = None
    wanted = list(tasks)
    if any(t in BUILTIN_TASKS for t in tasks):
        try:
            builtin_record = write_builtin_tasks(loaded, task_dir)
        except OSError as e:
            raise SanlabError(f"{task_dir}: cannot write the built-in tasks ({e.strerror or e})") from None
        for t, why in builtin_record["skipped"].items():
            if t in wanted:
                say(f"sanlab: note: {loaded.run.path}: {t} skipped ({why})")
                wanted.remove(t)
    verbose = bool(getattr(args, "verbose", False))
    if builtin_record is None and defaults is not None:
        manager = defaults
    else:
        with _lm_eval_output(verbose):
            manager = TaskManager(include_path=str(task_dir) if task_dir.is_dir() else None,
                                  include_defaults=needs_defaults)
    unknown = [t for t in wanted if t not in manager.all_tasks]
    if unknown:
        raise _unknown_task(unknown[0], len(manager.all_tasks))
    model = SanlabLM(loaded=loaded, batch_size=args.batch_size)
    # lm-eval records `git describe` of the working directory (not of the model's code, and
    # an error line outside a repository); the run dir's meta.json has the commit that matters
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    t0 = time.time()
    recall = [t for t in wanted if t in RECALL_TASKS]  # their stored bits need each item's outcome
    with _lm_eval_output(verbose):
        results = lm_eval.simple_evaluate(model=model, tasks=wanted, limit=args.limit, task_manager=manager,
                                          bootstrap_iters=args.bootstrap_iters, log_samples=bool(recall))
    if model.truncated:
        say(f"sanlab: warning: {loaded.run.path}: {model.truncated} requests longer than seq_len="
            f"{loaded.seq_len} were truncated from the left")
    out_file = results_file(eval_dir, loaded.checkpoint, args.limit)
    record = read_json(out_file) or {"run": str(loaded.run.path), "checkpoint": loaded.checkpoint,
                                     "limit": args.limit, "tasks": {}}
    members = results.get("group_subtasks") or {}
    for task, res in results["results"].items():
        record["tasks"][task] = {
            "metrics": _metrics(res),
            "n_samples": (results.get("n-samples", {}).get(task) or {}),
            "version": results.get("versions", {}).get(task),
            "limit": args.limit,
            # this task's own requests (a group's: its members'), not the run's total
            "truncated_requests": sum(model.truncated_by_task[t] for t in [task, *members.get(task, [])]),
        }
        if task in recall and builtin_record is not None:
            params = count_params(loaded.run.config.model).non_embedding
            record["tasks"][task]["metrics"].update(
                recall_metrics(results.get("samples", {}).get(task, []), builtin_record["recall"][task]["pool"], params))
    record["lm_eval_version"] = getattr(lm_eval, "__version__", None)
    if builtin_record is not None:
        record["builtin"] = builtin_record
    record["eval_time_s"] = round(time.time() - t0, 2)
    try:
        eval_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_file, record)
    except OSError as e:
        raise SanlabError(f"{out_file}: cannot write the results ({e.strerror or e})") from None
    return record


def recall_metrics(samples: list[dict[str, Any]], pool: int, params: int) -> dict[str, Any]:
    """A recall task's stored bits (`sanlab.eval.builtin.stored_bits`) from lm-eval's
    logged samples: each one's exact match and its item's K and bits."""
    from sanlab.eval.builtin import stored_bits  # lazy: torch, numpy (as above)

    return stored_bits([(float(s["exact_match"]), int(s["doc"]["values"]), float(s["doc"]["bits"])) for s in samples],
                       pool, params)


def results_file(eval_dir: Path, checkpoint: str, limit: int | None) -> Path:
    """Where an evaluation's record goes: a limited one beside the full one, never over it."""
    return eval_dir / (f"results-{checkpoint}.json" if limit is None else f"results-{checkpoint}-limit{limit}.json")


def _shown(task: str, metrics: dict[str, float]) -> list[tuple[str, str]]:
    """(column header, cell text) for a task's table columns."""
    for m in _SHOWN.get(task, _DEFAULT_SHOWN):
        if m in metrics:
            err = metrics.get(f"{m}_stderr")
            cell = f"{metrics[m]:.4f}" + (f" ± {err:.4f}" if err is not None and err == err else "")
            return [(f"{task}\n{m}", cell)]
    if metrics:
        m = sorted(metrics)[0]
        return [(f"{task}\n{m}", f"{metrics[m]:.4f}")]
    return []


def results_table(records: list[dict[str, Any]], tasks: list[str]) -> Any:
    """Runs × tasks, each task's main metric ± its stderr (`sanlab.tables.Table`)."""
    cells: list[dict[str, str]] = []
    headers: list[str] = []
    for rec in records:
        row: dict[str, str] = {}
        # the requested tasks and groups; the members of a requested name lm-eval reports no aggregate for
        missing = [t for t in tasks if t not in rec["tasks"]]
        for task in rec["tasks"]:
            if task not in tasks and not any(task.startswith(t) for t in missing):
                continue
            for head, cell in _shown(task, rec["tasks"][task]["metrics"]):
                row[head] = cell
                if head not in headers:
                    headers.append(head)
        cells.append(row)
    limit = records[0].get("limit")
    table = Table(f"zero-shot, checkpoint {records[0]['checkpoint']}"
                  + (f", LIMITED to the first {limit} examples per task (--limit; not a full evaluation)"
                     if limit is not None else ""))
    table.column("run")
    for h in headers:
        table.column(h, "right")
    for rec, row in zip(records, cells):
        table.add_row(Path(rec["run"]).name, *(row.get(h, "—") for h in headers))
    return table


def run(args: argparse.Namespace) -> int:
    _require_lm_eval()
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be positive, got {args.limit}")
    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
    if args.bootstrap_iters < 0:
        raise ConfigError(f"--bootstrap-iters must be non-negative, got {args.bootstrap_iters}")
    tasks, needs_defaults = _task_list(args.tasks)
    _quiet(args.verbose)
    from sanlab.analysis.rundir import RunDir  # lazy: torch; `sanlab eval --help` runs without it

    for p in args.runs:  # every run dir readable and its weights verified before hours of evaluation start
        RunDir.open(p).verify(args.checkpoint)
    # every task name known before anything is written (the built-in tasks' files included)
    defaults = check_task_names(tasks, args.verbose)
    out = Output(args.format)
    records = [evaluate_run(p, tasks, needs_defaults, args, out, defaults) for p in args.runs]
    out.table(results_table(records, tasks))
    for rec in records:
        out.note(f"results: {results_file(Path(rec['run']) / 'eval', rec['checkpoint'], args.limit)}")
    out.close()
    return 0
