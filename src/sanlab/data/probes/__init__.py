"""Probe tasks (SPEC §2), one file per task, registered by name.

    from sanlab.data.probes import TASKS, task_config, write_probe_dir
    cfg = task_config("retrieval", ["m_max=8"])
    write_probe_dir(TASKS["retrieval"], cfg, "data/retrieval")

See `base.py` for how examples become a prepared dir the regular trainer reads.

A task is one file of this package that ends with `TASK = register_task(ProbeTask(...))`:
its config, its generator, its default sizes and budgets (full and `--quick`), its column
label and SPEC §2's numbers. Every file here is imported when the package is (`pkgutil`,
as the mixers are found), so the runner, the suite, the records and the CLI see a new
task without an edit of their own; `copying.py` is the worked example.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Sequence

from pydantic import create_model

from sanlab.config import StrictModel, apply_overrides
from sanlab.data.probes.base import (TASKS, Column, Example, Generated, ProbeData, ProbeTask, TaskConfig, columns,
                                    plan_probe_dir, register_task, write_probe_dir)
from sanlab.errors import ConfigError

__all__ = ["TASKS", "Column", "Example", "Generated", "ProbeData", "ProbeTask", "TaskConfig", "columns", "get_task",
           "plan_probe_dir", "register_task", "task_config", "write_probe_dir"]


def _discover() -> None:
    """Import every file of this package (each registers its task), then order the
    registry as the grid is ordered (SPEC §2's columns)."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.ispkg and info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    ordered = sorted(TASKS.values(), key=lambda t: (t.position, t.name))
    TASKS.clear()
    TASKS.update((t.name, t) for t in ordered)


_discover()


def get_task(name: str) -> ProbeTask:
    if name not in TASKS:
        raise ConfigError(f"unknown probe task {name!r} (choose from {', '.join(TASKS)})")
    return TASKS[name]


def task_config(name: str, overrides: Sequence[str] = ()) -> TaskConfig:
    """The task's config with `key=value` overrides (without the `task.` prefix).

    Errors name the keys as the command line spells them (`task.n_train=abc`,
    `unknown key task.nope`): the overrides are applied under a `task` section.
    """
    cls = get_task(name).config
    section = create_model(f"{cls.__name__}Section", __base__=StrictModel, task=(cls, cls()))
    items = [f"task.{item.strip()}" if "=" in item else item for item in overrides]
    return apply_overrides(section, {}, items, source=f"probe {name}").task  # type: ignore[attr-defined]
