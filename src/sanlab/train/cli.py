"""`sanlab train [CONFIG.toml] [section.key=value …] --out RUN_DIR [--resume] [--force] [--nproc N]`.

Exit codes: 0 completed (or already complete), 2 user error, 3 diverged (a recorded
result, a collapse included), 4 interrupted by a signal after saving a checkpoint, 5 the
disk filled up while writing (the previous checkpoint is intact).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from sanlab import cli
from sanlab.cliargs import positive_int
from sanlab.config import Config, apply_overrides, format_tokens, load_config
from sanlab.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, ConfigError
from sanlab.paths import check_out_dir
from sanlab.train.signals import CommandSignals

_EXIT = {"completed": EXIT_OK, "diverged": EXIT_DIVERGED, "interrupted": EXIT_INTERRUPTED}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("items", nargs="*", metavar="[CONFIG.toml] [section.key=value]",
                        help="an optional TOML config, then overrides such as data.dir=DIR train.tokens=1e6")
    parser.add_argument("--out", required=True, type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in RUN_DIR from its latest checkpoint (its config.json "
                             "is the base config; overrides that change it need --force)")
    parser.add_argument("--force", action="store_true",
                        help="start over in an existing RUN_DIR, or with --resume accept a changed config")
    parser.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                        help="data-parallel processes on this machine (launches torch.distributed.run)")


def _split_items(items: list[str]) -> tuple[str | None, list[str]]:
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        raise ConfigError(f"expected at most one config file, got {' '.join(paths)}")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `sanlab train --help` runs without it
    from sanlab.train import dist, rundir
    from sanlab.train.trainer import make_plan, train

    path, overrides = _split_items(args.items)
    check_out_dir(args.out)
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    stored = args.out / rundir.CONFIG_FILE
    if args.resume and path is None and not overrides and not stored.is_file():
        # Nothing to take the config from: say why instead of asking for a training length.
        if not args.out.exists():
            raise ConfigError(f"--resume: {args.out} does not exist, so there is no run to resume "
                              "(drop --resume to start one)")
        raise ConfigError(f"--resume: {args.out} has no {rundir.CONFIG_FILE} (the run was stopped before "
                          "it started, or this is not a run dir); start it again with its config and --force")
    if args.resume and path is None and stored.is_file():
        # Resuming needs no config: the run dir has it; overrides apply on top of it.
        data = rundir.read_json(stored)
        if data is None:
            raise ConfigError(f"{stored}: unreadable run config")
        cfg = apply_overrides(Config, data, overrides, source=str(stored))
    else:
        cfg = load_config(path, overrides)
    cfg.data.dir = _absolute_data_dir(cfg.data.dir, rundir.read_json(stored))
    if args.nproc > 1 and not dist.in_torchrun():
        make_plan(cfg, args.nproc)  # batch / length errors here, once, not from every rank
        argv = ["train", *args.items, "--out", str(args.out)]
        argv += ["--resume"] * args.resume + ["--force"] * args.force
        return dist.launch(args.nproc, argv)
    # a signal before the run's own handlers reaches the run; one after it ended changes nothing
    with CommandSignals(keep=cli.OWN_PROCESS) as signals:
        meta = train(cfg, args.out, resume=args.resume, force=args.force)
        signals.ended()
        if os.environ.get("RANK", "0") != "0":
            # Under torchrun a non-zero exit makes the launcher stop the other ranks: only rank 0
            # reports the run's status (and so the job's exit code) once it has written it.
            return dist.exit_worker(EXIT_OK)
        print(final_line(meta, args.out))
        return dist.exit_worker(_EXIT.get(meta["status"], EXIT_OK))


def _absolute_data_dir(data_dir: str | None, stored: dict | None) -> str | None:
    """`data.dir` as an absolute path, so the run dir's config.json names the data from any
    working directory (`sample`, `eval`, `export` run elsewhere). A run dir written before
    (`stored`: its config.json) keeps its relative spelling where that names the same dir,
    so rerunning or resuming it is not a changed config."""
    if data_dir is None or os.path.isabs(data_dir):
        return data_dir
    old = (stored or {}).get("data")
    old = old.get("dir") if isinstance(old, dict) else None
    if isinstance(old, str) and os.path.abspath(old) == os.path.abspath(data_dir):
        return old
    return os.path.abspath(data_dir)


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def final_line(meta: dict, out: object) -> str:
    """`completed: RUN  steps 400  train_loss 5.6609  val_loss 5.8744  (1.6M tokens, 35.8k tokens/s)`:
    the losses at the step the run ended (an interrupted run is evaluated where it stopped;
    n/a where there is no finite value, as after a divergence)."""
    final = meta.get("final") or {}
    line = (f"{meta.get('status')}: {out}  steps {final.get('steps')}  train_loss {_num(final.get('train_loss'))}"
            f"  val_loss {_num(final.get('val_loss'))}")
    extra = []
    if isinstance(final.get("tokens"), int):
        extra.append(f"{format_tokens(final['tokens'])} tokens")
    tps = meta.get("tokens_per_s")
    if isinstance(tps, (int, float)) and math.isfinite(tps):
        extra.append(f"{tps / 1000:.1f}k tokens/s")
    return line + (f"  ({', '.join(extra)})" if extra else "")
