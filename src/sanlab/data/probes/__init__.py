"""Probe tasks (SPEC §2), one file per task, registered by name.

    from sanlab.data.probes import TASKS, task_config, write_probe_dir
    cfg = task_config("retrieval", ["m_max=8"])
    write_probe_dir(TASKS["retrieval"], cfg, "data/retrieval")

See `base.py` for how examples become a prepared dir the regular trainer reads.
"""

from __future__ import annotations

from typing import Sequence

from pydantic import create_model

from sanlab.config import StrictModel, apply_overrides
from sanlab.data.probes import addition, dyck, induction, memorize, modadd, retrieval, sentiment
from sanlab.data.probes.base import (Example, Generated, ProbeData, ProbeTask, TaskConfig, plan_probe_dir,
                                    write_probe_dir)
from sanlab.errors import ConfigError

TASKS: dict[str, ProbeTask] = {
    t.name: t
    for t in (addition.TASK, modadd.TASK, memorize.TASK, retrieval.TASK, induction.TASK, dyck.TASK,
              sentiment.TASK)
}

__all__ = ["TASKS", "Example", "Generated", "ProbeData", "ProbeTask", "TaskConfig", "get_task", "plan_probe_dir",
           "task_config", "write_probe_dir"]


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
