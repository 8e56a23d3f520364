"""Data parallelism in one place: torchrun / DDP helpers that do nothing on one process.

Under `torchrun` (RANK / WORLD_SIZE / LOCAL_RANK in the environment) `setup` joins the
process group (NCCL on CUDA, gloo on CPU) and picks this rank's device; otherwise it
returns a single-process `Dist` whose every method is a no-op. The trainer talks only
to `Dist`, so the loop holds no `if distributed:` branches.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as tdist
from torch import nn

from sanlab.errors import EXIT_INTERRUPTED


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Only the main rank writes files and prints."""
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP-wrap the model when distributed; the model itself otherwise."""
        if not self.enabled:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.enabled and not sync:
            assert isinstance(model, nn.parallel.DistributedDataParallel)
            return model.no_sync()
        return contextlib.nullcontext()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few float64 scalars over ranks (token counts, loss sums)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any: all ranks stop at the same step."""
        return bool(self.sum([float(flag)])[0]) if self.enabled else flag

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def close(self) -> None:
        if self.enabled and tdist.is_initialized():
            tdist.destroy_process_group()


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup(device_type: str) -> Dist:
    """Join the torchrun job if there is one and pick this rank's device."""
    if not in_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return Dist(device=torch.device(device_type))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        tdist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        tdist.init_process_group("gloo")
    return Dist(rank, world, local, device)


@contextlib.contextmanager
def session(device_type: str) -> Iterator[Dist]:
    """`setup` plus teardown of the process group, whatever happens in the body."""
    d = setup(device_type)
    try:
        yield d
    finally:
        d.close()


def exit_worker(code: int) -> int:
    """End a torchrun worker with `code` without finalising the interpreter; elsewhere
    just return `code`.

    gloo destroys a finished collective's work object on its own thread, and that drops
    Python tensors, which needs the GIL. When the last collective of a run finishes just
    as the main thread starts finalising, CPython ends that thread with pthread_exit, whose
    unwind through C++ aborts the process ("terminate called without an active
    exception"): torchrun then reports a completed run as a failed rank. Everything a run
    writes is closed and atomic before this point, so skipping finalisation loses nothing.
    """
    if in_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Re-run `sanlab <argv>` under torch.distributed.run with `nproc` local processes.

    The same thing as `torchrun --standalone --nproc_per_node=N -m sanlab …`, without
    needing the torchrun script on PATH.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run  # the torchrun implementation

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc_per_node={nproc}", "--module", "sanlab", *argv]
    )
    # torchrun sets OMP_NUM_THREADS=1 when it is unset; keep the machine's cores in use.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    try:
        run(args)
    except ChildFailedError as e:
        # Workers exit with sanlab's codes (3 diverged, 4 interrupted); pass rank 0's on.
        return e.get_first_failure()[1].exitcode or 1
    except SignalException:
        # The launcher was told to stop and passed SIGTERM on: the ranks checkpoint and stop.
        return EXIT_INTERRUPTED
    return 0
