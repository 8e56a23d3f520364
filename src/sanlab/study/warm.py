"""Warm workers: a `LocalRunner` worker's runs forked from a process that has imported
torch and sanlab's training code once, instead of each starting Python afresh.

A run's process used to spend ~2.4 s before its first step importing torch, torch's
compiler stack (every `torch.optim` optimizer imports it on construction) and sanlab:
in the demo study, 11 groups of about 2–23 s each, that was ~20% of its wall time.
Each worker now keeps one warm process (`python -m sanlab.study.warm`), which imports
all of that, then reads one request a line on stdin and forks a child for it: the child
is the run's process exactly as before (its own process, so a crash or an out-of-memory
kill takes only that run; its output to the job's log; the same `main` of
`sanlab.study.runner` or `sanlab.study.groups`; SIGTERM when its parent dies), only
without the imports. The warm process writes the child's exit code back as a line.

It forks only while it is single-threaded (no thread pool started: it imports, it never
computes); otherwise it says so and the runner starts each run as a new process, as it
does when the warm process cannot start at all or `SANLAB_WARM_WORKERS=0`.

Death chain: the warm process asks for SIGTERM when the study process dies, and each
child for SIGTERM when the warm process dies (its parent), so killing the study still
stops every run, which saves its checkpoint on SIGTERM.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any, Sequence


# what a run's process imports before its first step (the trainer, the members' trainer,
# the entry points, and torch's compiler stack that the optimizers import)
PRELOAD = ("torch", "torch._dynamo", "sanlab.train.trainer", "sanlab.train.members", "sanlab.study.runner",
           "sanlab.study.groups")
# the entry points a child may run: a run, a group of members, a final pair group's analysis
# (a local runner's side task; imported in the child, the rest of its imports being loaded)
ENTRY_POINTS = ("sanlab.study.runner", "sanlab.study.groups", "sanlab.report.analyze_job")
READY = "ready"


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


# A run's (or a member group's) start when forked from a warm process: from its request to
# its trainer's first line of work. Measured 0.15-0.36 s in the demo study (2-core AMD
# EPYC, `jobs/*.group.json` written to meta.json's started_at, 9 groups); `study plan`
# counts this per run instead of a fresh process's `ready_s` (sanlab.study.plan).
WARM_START_S = 0.3


def enabled() -> bool:
    """Whether LocalRunner forks its runs from warm processes (`SANLAB_WARM_WORKERS=0`: no)."""
    return os.environ.get("SANLAB_WARM_WORKERS", "1") != "0" and hasattr(os, "fork") and sys.platform != "darwin"


def _threads() -> int:
    """This process's threads (Linux: its tasks)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _child(request: dict[str, Any], sigint: Any) -> None:
    """In the forked child: become the run's process (log, environment, signals: SIGINT
    as the study's own, `sigint`), run its entry point's `main`, exit with its code.
    Never returns."""
    rc = 1
    try:
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        # its parent is this warm process: the entry point checks it and dies with it
        os.environ.update({**request["env"], "SANLAB_PARENT_PID": str(os.getppid())})
        module = request["module"]
        if module not in ENTRY_POINTS:
            raise ValueError(f"not an entry point: {module}")
        sys.argv = [module, *request["argv"]]
        rc = int(importlib.import_module(module).main(request["argv"]) or 0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child's last word goes to its log
        traceback.print_exc()
        rc = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def serve(stdin: IO[str], stdout: IO[str]) -> int:
    """The warm process: import, then fork a child for each request line until stdin closes."""
    # Ctrl-C reaches the study's whole process group: the child stops its run (a
    # checkpoint) while this process waits for it, as the study process does. The child
    # gets the study's own SIGINT back (ignored where the study's is, as a background job's)
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.environ.get("SANLAB_PARENT_PID")
    die_with_parent()
    if parent is not None and os.getppid() != int(parent):
        return 1  # the study died before the death signal was armed
    import gc

    # no collections while importing: the imports make ~300k objects, and collecting them on
    # the way cost ~0.5 s of ~2.3 s; then they move to the permanent generation, so that no
    # later collection of a forked run walks them (nor touches their pages, shared with it)
    gc.disable()
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()
    if _threads() != 1:
        stdout.write(f"cold: {_threads()} threads after the imports\n")
        stdout.flush()
        return 0
    stdout.write(READY + "\n")
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, sigint)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        stdout.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        stdout.flush()
    return 0


class WarmWorker:
    """One warm process, owned by one runner thread at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        # (its stderr discarded: a warm process that fails to import says nothing useful
        # here, and the run then starts as a new process, which writes the error to its log)
        self.proc = subprocess.Popen([sys.executable, "-m", "sanlab.study.warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     bufsize=1)
        self.ready: bool | None = None  # settled by the first `run`

    def _settle(self) -> bool:
        if self.ready is None:
            assert self.proc.stdout is not None
            self.ready = self.proc.stdout.readline().strip() == READY
        return self.ready

    def run(self, module: str, argv: Sequence[str], log: Path, env: dict[str, str]) -> int | None:
        """The exit code of `module`'s main on `argv` in a forked child (None: this warm
        process cannot fork runs, start the run as a new process instead)."""
        if not self._settle() or self.proc.poll() is not None:
            return None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps({"module": module, "argv": list(argv), "log": str(log),
                                              "env": env}) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            reply = ""
        try:
            return int(json.loads(reply)["rc"])
        except (ValueError, KeyError, TypeError):
            # the warm process died (killed, out of memory) or garbled its reply: no more runs
            # from it (a run it had started resumes or returns as it is in the new process)
            self.ready = False
            return None

    def close(self) -> None:
        if self.ready is None:  # never asked to run anything (a study with nothing left to run):
            self.proc.kill()    # stop it now rather than wait for its imports to finish
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(serve(sys.stdin, sys.stdout))
