"""Where a run's numbers go: metrics.jsonl always, the terminal, optional trackers.

`metrics.jsonl` is the record the analysis reads (one JSON object per line, flushed
per line so a killed run loses at most the line being written). The terminal gets a
rich progress bar when it is a TTY and plain lines otherwise (log files, CI).
TensorBoard and W&B (offline unless WANDB_MODE says otherwise) are extra sinks,
only when enabled and installed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from sanlab.config import Config
from sanlab.errors import ConfigError
from sanlab.fileio import read_jsonl


def _clean(value: Any) -> Any:
    """Non-finite floats become null: metrics.jsonl stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep only the lines up to `last_step` (a resume restarts right after it).

    Lines written after the checkpoint, and a half-written last line, are dropped so
    the resumed run appends exactly the lines the uninterrupted run would have written.
    """
    if not path.exists():
        return
    kept = []
    for _, raw, row in read_jsonl(path):
        step = row.get("step", math.inf) if row is not None else math.inf  # a damaged line: the end
        if not isinstance(step, (int, float)) or step > last_step:
            break
        kept.append(raw)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in kept))
    os.replace(tmp, path)


def _fmt_eta(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class RunLog:
    """All sinks of one run; a no-op on ranks other than the main one."""

    def __init__(self, out: Path, cfg: Config, total_steps: int, start_step: int,
                 *, enabled: bool) -> None:
        self.enabled, self.total, self.every = enabled, total_steps, cfg.train.log_every
        self._file = open(out / "metrics.jsonl", "a") if enabled else None
        self._tb: Any = None
        self._wandb: Any = None
        self._bar: Any = None
        self._t0, self._s0 = time.perf_counter(), start_step
        if not enabled:
            return
        if cfg.train.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard=true needs the tensorboard package") from None
            self._tb = SummaryWriter(str(out / "tensorboard"))
        if cfg.train.wandb:
            try:
                import wandb
            except ImportError:
                raise ConfigError("train.wandb=true needs the wandb package") from None
            self._wandb = wandb.init(
                dir=str(out), name=out.name, config=cfg.model_dump(), resume="allow",
                mode=os.environ.get("WANDB_MODE", "offline"),
            )
        if sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start_step, info="")
            self._bar.start()

    def log(self, row: dict[str, Any]) -> None:
        """Record one step's metrics in every sink."""
        if not self.enabled:
            return
        assert self._file is not None
        self._file.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._file.flush()
        step = row["step"]
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in numbers.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        info = "  ".join(
            f"{k} {row[k]:.4g}" for k in ("loss", "val_loss", "lr") if row.get(k) is not None
        ) + f"  {row.get('tokens_per_s', 0.0) / 1e3:.1f}k tok/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif step % self.every == 0 or "val_loss" in row or step == self.total:
            rate = (step - self._s0) / max(time.perf_counter() - self._t0, 1e-9)
            eta = _fmt_eta((self.total - step) / rate) if rate > 0 else "?"
            print(f"step {step}/{self.total}  {info}  eta {eta}", flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            (self._bar.console.print if self._bar is not None else print)(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._file is not None:
            self._file.close()
