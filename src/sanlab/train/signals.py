"""Graceful stop on SIGTERM / SIGINT (cluster preemption, Ctrl-C).

The first signal only sets a flag; the loop sees it at the next step boundary, writes a
checkpoint and exits with status `interrupted`. A second signal exits at once. A copy
of the same signal arriving within a second (Ctrl-C reaches every process of a torchrun
job directly *and* through the launcher) counts as the first.

`CommandSignals` holds the signals of the whole `sanlab train` command around the run: one
that arrives before the run has installed its own handlers (while the data is checked and
the model built) is handed to the run, which then stops at its first step boundary with a
checkpoint; one that arrives after the run has ended changes nothing, so a completed run
exits 0 however late a SIGTERM comes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType, TracebackType

from sanlab.errors import EXIT_INTERRUPTED

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_DUPLICATE_WINDOW_S = 1.0


class StopSignal:
    """Context manager that installs the handlers (main thread only) and restores them."""

    def __init__(self) -> None:
        self.requested = False
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.requested and now - self._first_at > _DUPLICATE_WINDOW_S:
            os._exit(EXIT_INTERRUPTED)
        if not self.requested:
            self.requested, self._first_at = True, now

    def __enter__(self) -> "StopSignal":
        # Python only lets the main thread install handlers; a run started from a worker
        # thread (e.g. a study's thread pool) leaves signal handling to its owner.
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
            for prev in self._previous.values():  # a request made before this run started is this run's
                outer = getattr(prev, "__self__", None)
                if isinstance(outer, StopSignal) and outer.requested and not self.requested:
                    self.requested, self._first_at = True, outer._first_at
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]


class CommandSignals(StopSignal):
    """The handlers of a whole train command (see the module docstring). `ended()` marks
    the run over: from then on a signal is ignored, its outcome (and exit code) being
    decided. With `keep` (sanlab's own process, `sanlab.cli.entry`) they stay ignored after
    the command too, through the printing of the last line and the interpreter's shutdown."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep
        self.done = False

    def ended(self) -> None:
        self.done = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.done:
            super()._handle(signum, frame)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.keep and self.done and self._previous:
            for s in self._previous:
                signal.signal(s, signal.SIG_IGN)
            return
        super().__exit__(exc_type, exc, tb)
