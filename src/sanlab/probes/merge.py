"""`sanlab probe --suite --merge SRC --out DIR`: one suite from suites run in pieces.

A suite is often run a task or two at a time, on different machines or on different
days (`--tasks retrieval` on one, `--tasks capacity` on another). Merging adds each
SRC's cells to DIR's own (DIR's suite.json, when it has one) and writes DIR/suite.json
and suite.csv again from all of them, exactly as one `--suite` run over every task would
have written them: the grid, the capacity arithmetic, the anchors and the unscored cells
are recomputed from the cells; nothing is copied from a piece's table.

The pieces must be the same suite: the same arms (names and overrides) and the same
`quick`. A task may come from one piece only (two pieces with a task in common are two
measurements of one cell; the merge refuses rather than pick one). Each SRC's run files
(`runs/RUN_ID/{config,meta,probe}.json` of every sweep point) and its `probe-TASK.json`
ablation files are copied into DIR when DIR does not have them; a sweep point whose run
files its SRC lacks keeps the numbers its suite.json holds, and the merge says how many.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from sanlab.errors import ConfigError, DataError
from sanlab.fileio import read_json
from sanlab.probes.layout import RUN_FILES, SUITE, check_results, point_run_dirs, task_of
from sanlab.probes.suite import SUITE_TASKS, assemble, write_results


def _suite(d: Path) -> dict[str, Any]:
    path = d / SUITE
    if not d.is_dir():
        raise DataError(f"--merge {d}: " + ("not a directory" if d.exists() else "no such directory"))
    if not path.is_file():
        raise DataError(f"--merge {d}: no {SUITE} (a `sanlab probe --suite --out DIR` dir)")
    data = read_json(path)
    try:
        return check_results(data, suite=True)
    except ValueError as e:
        raise DataError(f"{path}: not a probe suite's results as `sanlab probe --suite` writes them ({e})") from None


def _results(path: Path) -> dict[str, Any]:
    """A piece's `probe-TASK.json` ablation file, checked as every results file is."""
    try:
        return check_results(read_json(path))
    except ValueError as e:
        raise DataError(f"{path}: not a probe's results as `sanlab probe TASK` writes them ({e})") from None


def _arms_key(arms: Iterable[dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    return [(a.get("name"), tuple(a.get("overrides") or ())) for a in arms]


def _copy(src: Path, dst: Path) -> bool:
    """Copy `src` to `dst` atomically unless `dst` is there; True when copied."""
    if dst.exists() or not src.is_file():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    return True


def join(tasks: Iterable[str], arms: Sequence[dict[str, Any]], cells: Iterable[dict[str, Any]], *,
         quick: bool, wall_s: float | None) -> dict[str, Any]:
    """The results of `tasks` (in SPEC §2's column order) from cells gathered from several
    places, each task's cells together."""
    order = [t for t in SUITE_TASKS if t in set(tasks)]
    cells = list(cells)
    return assemble(order, arms, [c for t in order for c in cells if task_of(c) == t], quick=quick, wall_s=wall_s)


def merge(sources: Sequence[Path], out: Path, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """The merged results (module docstring), written to `out`; `DataError` / `ConfigError`
    (one line) for a source that is not a suite or a piece that does not fit. Everything is
    checked before anything is copied or written."""
    pieces: list[tuple[Path, dict[str, Any]]] = []
    own = int((out / SUITE).is_file())  # DIR's own suite: its run files are there already
    if own:
        pieces.append((out, _suite(out)))
    for s in sources:
        if Path(os.path.abspath(s)) == Path(os.path.abspath(out)):
            raise ConfigError(f"--merge {s} is the --out dir itself (its own suite.json is always merged)")
        pieces.append((s, _suite(s)))
    first_dir, first = pieces[0]
    owner: dict[str, Path] = {}
    for d, suite in pieces:
        mine, theirs = _arms_key(suite["arms"]), _arms_key(first["arms"])
        for (name, a), (other, b) in zip(mine, theirs):
            if name == other and a != b and len(mine) == len(theirs):  # the same names, not the same arms
                raise ConfigError(f"{d / SUITE}: its arm {name!r} has overrides [{', '.join(a)}], not "
                                  f"[{', '.join(b)}] as in {first_dir / SUITE}; a merge joins pieces of one suite")
        if mine != theirs:
            raise ConfigError(f"{d / SUITE}: its arms ({', '.join(a for a, _ in _arms_key(suite['arms']))}) are "
                              f"not {first_dir / SUITE}'s ({', '.join(a for a, _ in _arms_key(first['arms']))}); "
                              "a merge joins pieces of one suite")
        if bool(suite.get("quick")) != bool(first.get("quick")):
            raise ConfigError(f"{d / SUITE} is {'' if suite.get('quick') else 'not '}--quick and "
                              f"{first_dir / SUITE} is {'' if first.get('quick') else 'not '}; a merge "
                              "joins pieces of one suite")
        for task in suite["tasks"]:
            if task in owner:
                raise ConfigError(f"task {task!r} is in both {owner[task] / SUITE} and {d / SUITE}: "
                                  "merge pieces with different tasks")
            if task not in SUITE_TASKS:
                raise DataError(f"{d / SUITE}: unknown suite task {task!r}")
            owner[task] = d
    extra = [(d, sorted(d.glob("probe-*.json"))) for d, _ in pieces[own:]]  # their ablation files
    try:
        run_dirs = [(d, point_run_dirs(data)) for (d, suite), (_, files) in zip(pieces[own:], extra)
                    for data in [suite, *(_results(f) for f in files)]]
    except ValueError as e:  # a run dir outside runs/
        raise DataError(f"--merge: {e}") from None
    walls = [s["wall_s"] for _, s in pieces if isinstance(s.get("wall_s"), (int, float))]
    res = join(owner, first["arms"], (c for d, s in pieces for c in s["cells"] if owner.get(task_of(c)) == d),
               quick=bool(first.get("quick")), wall_s=sum(walls) if walls else None)

    copied = without = 0
    for d, files in extra:
        copied += sum(_copy(f, out / f.name) for f in files)
    seen: set[tuple[Path, str]] = set()
    for d, dirs in run_dirs:
        for rd in dirs:
            if (d, rd) in seen:
                continue
            seen.add((d, rd))
            without += not any((d / rd / f).is_file() for f in RUN_FILES)
            copied += sum(_copy(d / rd / f, out / rd / f) for f in RUN_FILES)
    json_path, _ = write_results(res, out, "suite")
    log(f"merged {len(pieces)} suite(s): {', '.join(f'{t} ({owner[t]})' for t in res['tasks'])} → {json_path}; "
        f"{copied} file(s) copied" + (f"; {without} sweep point(s) without run files in their source "
                                      "(their numbers are the source's suite.json's)" if without else ""))
    return res


def carried(out: Path, arms: Sequence[dict[str, Any]], quick: bool, tasks: Sequence[str],
            log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """The cells of DIR's suite.json for tasks this `--suite` run does not have, so that a
    run of some tasks into a suite's dir adds its columns instead of dropping the others
    (whose run files may not be there to gather them again: a merged record's). Nothing
    is carried from a suite of other arms or another `--quick`; the note says it is replaced."""
    path = out / SUITE
    if not path.is_file():
        return []
    try:
        old = _suite(out)
    except DataError as e:
        log(f"replacing {path}: {e}")
        return []
    if _arms_key(old["arms"]) != _arms_key(arms) or bool(old.get("quick")) != quick:
        log(f"replacing {path}: its arms ({', '.join(a for a, _ in _arms_key(old['arms']))}"
            f"{', --quick' if old.get('quick') else ''}) are not this suite's")
        return []
    keep = [t for t in old["tasks"] if t not in tasks]
    if keep:
        log(f"{path} keeps {', '.join(keep)} from before (their cells as they were)")
    return [c for c in old["cells"] if task_of(c) in keep]


__all__ = ["carried", "join", "merge"]
