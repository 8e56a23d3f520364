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


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false", int: "an integer",
               float: "a number", type(None): "null"}

# key -> (check, what it must be) for the keys the readers use, in a results file, a cell
# and a sweep point: every other key is carried as it is
_TOP = {"tasks": (_strs, "a list of task names"), "quick": (_opt(lambda v: isinstance(v, bool)), "true or false"),
        "wall_s": (_opt(_num), "a number"), "table": (lambda v: isinstance(v, dict), "an object"),
        "capacity": (lambda v: isinstance(v, dict), "an object"), "anchors": (lambda v: isinstance(v, dict), "an object"),
        "unscored": (lambda v: isinstance(v, dict), "an object")}
_ARM = {"name": (lambda v: isinstance(v, str), "a string"), "label": (lambda v: isinstance(v, str), "a string"),
        "overrides": (_strs, "a list of strings")}
_CELL = {"key": (lambda v: isinstance(v, str), "a string"), "task": (lambda v: isinstance(v, str), "a string"),
         "label": (lambda v: isinstance(v, str), "a string"),
         "arm": (lambda v: isinstance(v, str), "a string"), "test_correct": (_opt(_int), "an integer"),
         "test_total": (_opt(_int), "an integer"), "test_accuracy": (_opt(_num), "a number"),
         "val_accuracy": (_opt(_num), "a number"), "params": (_opt(_int), "an integer"),
         "trainable_params": (_opt(_int), "an integer"), "lr": (_opt(_num), "a number"),
         "multiplier": (_opt(_num), "a number"), "at_edge": (_opt(lambda v: isinstance(v, bool)), "true or false"),
         "task_config": (_opt(lambda v: isinstance(v, dict)), "an object"),
         "arm_overrides": (_opt(_strs), "a list of strings"), "points": (_opt(lambda v: isinstance(v, list)), "a list")}
_POINT = {"run_dir": (_opt(lambda v: isinstance(v, str)), "a string"), "test_correct": (_opt(_int), "an integer"),
          "test_total": (_opt(_int), "an integer"), "test_accuracy": (_opt(_num), "a number"),
          "val_accuracy": (_opt(_num), "a number"), "lr": (_opt(_num), "a number"),
          "n": (_opt(_int), "an integer"), "memorised": (_opt(_num), "a number")}


# what a merge recomputes the grid from (`sanlab.probes.suite.assemble`): every cell has them
_MERGED = ("key", "arm", "label", "points", "lr", "multiplier", "at_edge", "val_accuracy", "test_accuracy",
           "test_correct", "trainable_params", "task_config")  # (and what printing the cells reads)
_CAPACITY_CONFIG = {"n_train": (_int, "an integer"), "alphabet": (_int, "an integer")}


def _fields(obj: Any, where: str, fields: dict[str, Any], required: tuple[str, ...] = ()) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'the file'}: {_TYPE_NAMES.get(type(obj), type(obj).__name__)}, not an object")
    for key in required:
        if key not in obj:
            raise ValueError(f"{where or 'the file'}: no {key!r}")
    for key, (check, what) in fields.items():
        if key in obj and not check(obj[key]):
            raise ValueError(f"{where + '.' if where else ''}{key}: "
                             f"{_TYPE_NAMES.get(type(obj[key]), type(obj[key]).__name__)}, not {what}")


def check_results(data: Any, *, suite: bool = False) -> dict[str, Any]:
    """A results file (`suite.json`, `probe-TASK.json`) as its readers use it: `ValueError`
    naming the first key whose value is not what the writer gives (`cells[3].points[0]:
    a list, not an object`), so a hand edit or a damaged file is one line, never a
    TypeError deep in a merge or a record. A `suite` (what a merge joins) names its tasks."""
    _fields(data, "", _TOP, ("tasks", "arms", "cells") if suite else ("arms", "cells"))
    for name, what in (("arms", "arms"), ("cells", "cells")):
        if not isinstance(data[name], list):
            raise ValueError(f"{what}: {_TYPE_NAMES.get(type(data[name]), type(data[name]).__name__)}, not a list")
    for i, arm in enumerate(data["arms"]):
        _fields(arm, f"arms[{i}]", _ARM, ("name",))
    for i, cell in enumerate(data["cells"]):
        _fields(cell, f"cells[{i}]", _CELL, _MERGED if suite else ("key",))
        if suite and str(cell["key"]).startswith(CAPACITY + "-"):  # the capacity arithmetic reads these
            _fields(cell["task_config"], f"cells[{i}].task_config", _CAPACITY_CONFIG, ("n_train", "alphabet"))
        for j, point in enumerate(cell.get("points") or []):
            _fields(point, f"cells[{i}].points[{j}]", _POINT)
    for section in ("table", "capacity", "anchors", "unscored"):
        for arm, row in (data.get(section) or {}).items():
            if not isinstance(row, dict):
                raise ValueError(f"{section}[{arm!r}]: {_TYPE_NAMES.get(type(row), type(row).__name__)}, "
                                 "not an object")
    for arm, cap in (data.get("capacity") or {}).items():
        points = cap.get("points")
        if points is not None and not isinstance(points, list):
            raise ValueError(f"capacity[{arm!r}].points: {_TYPE_NAMES.get(type(points), type(points).__name__)}, "
                             "not a list")
        for j, point in enumerate(points or []):
            _fields(point, f"capacity[{arm!r}].points[{j}]", _POINT)
    return data


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


__all__ = ["CAPACITY", "DATA", "JOBS", "RUNS", "RUN_FILES", "SUITE", "SUITE_CSV", "check_results", "point_run_dirs",
           "task_of"]
