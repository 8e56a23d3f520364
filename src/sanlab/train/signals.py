"""Graceful stop on SIGTERM / SIGINT (cluster preemption, Ctrl-C).

The first signal only sets a flag; the loop sees it at the next step boundary, writes a
checkpoint and exits with status `interrupted`. A second signal exits at once. A copy
of the same signal arriving within a second (Ctrl-C reaches every process of a torchrun
job directly *and* through the launcher) counts as the first.
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
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
