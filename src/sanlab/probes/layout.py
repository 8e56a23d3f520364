"""What a probe's `--out` dir holds, and how its results files name things (no torch,
no numpy: `sanlab record` reads probe records through this module).

    DIR/data/TASK-HASH/          the probe data dirs
    DIR/runs/RUN_ID/             a run dir per sweep point; reuse reads RUN_FILES
    DIR/jobs/                    the study runner's job, outcome, lock and log files
    DIR/suite.json, suite.csv    `--suite`'s results; `probe-TASK.json` / `.csv` for one task

A results file's cells are keyed `TASK/ARM`, or `capacity-nN/ARM` for the capacity
sweep's cells, and each sweep point names its run dir relative to DIR (`runs/RUN_ID`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA = "data"
RUNS = "runs"
JOBS = "jobs"
RUN_FILES = ("config.json", "meta.json", "probe.json")  # what reusing a finished run reads of its dir
SUITE = "suite.json"
SUITE_CSV = "suite.csv"
CAPACITY = "capacity"  # the memorization-capacity sweep: a pseudo-task over task `memorize`


def task_of(cell: dict[str, Any]) -> str:
    """The suite column a results cell belongs to (a `capacity-nN/ARM` cell: capacity)."""
    key = str(cell.get("key", ""))
    return CAPACITY if key.startswith(CAPACITY + "-") else key.split("/")[0]


def point_run_dirs(results: Any) -> list[str]:
    """Every sweep point's run dir that a results file names, once each, in order;
    `ValueError` for one that is not `runs/RUN_ID` (a results file may not point outside DIR)."""
    out: dict[str, None] = {}
    for cell in (results.get("cells") or []) if isinstance(results, dict) else []:
        for point in cell.get("points") or []:
            run_dir = point.get("run_dir")
            if not isinstance(run_dir, str):
                continue
            parts = Path(run_dir).parts
            if len(parts) != 2 or parts[0] != RUNS or ".." in parts:
                raise ValueError(f"run dir {run_dir!r} is not {RUNS}/RUN_ID")
            out[run_dir] = None
    return list(out)


__all__ = ["CAPACITY", "DATA", "JOBS", "RUNS", "RUN_FILES", "SUITE", "SUITE_CSV", "point_run_dirs", "task_of"]
