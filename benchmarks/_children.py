"""Timing processes for the benchmarks: each measurement runs in a fresh spawned process
(its own allocator, threads and peak RSS), and its result comes back through a queue.

A child that dies without a result (its traceback is on stderr, or the OOM killer took it)
ends the benchmark with one line naming its exit code, instead of a parent waiting on the
queue forever, and the children still running are stopped (they may be waiting for it at
a barrier).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from typing import Any, Callable, Sequence


def run_children(name: str, target: Callable[..., None], args: Sequence[tuple[Any, ...]], *,
                 barrier: bool = False) -> list[Any]:
    """Start `target(*a, queue)` (with `barrier`: `target(*a, queue, barrier)`, one barrier
    for all) in a spawned process per `a` in `args`, side by side; the items they put on the
    queue, in the order they arrive. `name` begins the error line."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    extra = (ctx.Barrier(len(args)),) if barrier else ()
    procs = [ctx.Process(target=target, args=(*a, queue, *extra)) for a in args]
    for p in procs:
        p.start()
    out: list[Any] = []
    try:
        while len(out) < len(procs):
            try:
                out.append(queue.get(timeout=1.0))
                continue
            except queue_mod.Empty:
                pass
            gone = [p for p in procs if p.exitcode is not None]
            if len(gone) > len(out):  # a process ended without putting its result
                try:  # (a result put just before its process ended may still be in the pipe)
                    out.append(queue.get(timeout=1.0))
                    continue
                except queue_mod.Empty:
                    pass
                code = next((p.exitcode for p in gone if p.exitcode != 0), 0)
                raise SystemExit(f"{name}: a timing process ended without its result (exit code {code}); "
                                 "see its error above")
    finally:
        for p in procs:
            if p.exitcode is None and len(out) < len(procs):
                p.kill()
            p.join()
    return out
