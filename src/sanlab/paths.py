"""Output locations, checked before any work starts.

Every command that writes (`prepare`, `train`, `study run`, `analyze`, `signal --json`)
passes its destination through `check_out_dir` / `check_out_file` first, so a
destination that cannot be written is one `sanlab: error: …` line (exit 2) naming it
instead of an `OSError` traceback after minutes of work:

- an existing file where a directory is wanted (or a directory where a file is);
- a path under a file (`out.txt/run`);
- a directory this process may not write in (permissions, a read-only filesystem).

The checks create nothing. `staged_dir` is how a command writes a whole directory
atomically: it builds it beside the destination and swaps it in when it is complete.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sanlab.errors import ConfigError, NoSpaceError

RUN_DIR_MARKERS = ("config.json", "meta.json")  # what makes a directory a training run dir


def _nearest_existing(p: Path) -> Path:
    """`p` or its closest ancestor that exists (as anything: a file stops the walk too)."""
    p = Path(os.path.abspath(p))
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        p = p.parent
    return p


def _cannot_create_in(d: Path) -> str | None:
    """Why nothing can be created in the directory `d`, or None when something can.

    Permissions say no for most places; some say yes and refuse all the same (`/proc`, a
    read-only or full filesystem seen as root), so a directory is made there and removed
    at once: the one test that answers for every filesystem, and it leaves nothing behind.
    """
    if not os.access(d, os.W_OK | os.X_OK):
        return f"no permission to write in {d}"
    try:
        probe = tempfile.mkdtemp(prefix=".sanlab-write-check-", dir=d)
    except OSError as e:
        raise_no_space(e, f"in {d}")
        return f"cannot create anything in {d} ({e.strerror or e})"
    os.rmdir(probe)
    return None


def _check_parent(p: Path, what: str) -> None:
    """The directory `p` (not there yet) would be created in must be a writable directory."""
    anc = _nearest_existing(p.parent)
    if not anc.is_dir():
        raise ConfigError(f"{what} {p}: {anc} is a file, not a directory")
    why = _cannot_create_in(anc)
    if why:
        raise ConfigError(f"{what} {p}: {why}")


def check_out_dir(path: str | Path, what: str = "--out") -> Path:
    """Refuse an output directory that cannot be created or written (see the module docstring)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {p}: exists and is not a directory")
    if not p.exists():
        _check_parent(p, what)
    elif (why := _cannot_create_in(p)) is not None:
        raise ConfigError(f"{what} {p}: {why.replace(f' in {p}', ' in it')}")
    return p


def check_out_file(path: str | Path, what: str) -> Path:
    """Refuse an output file that cannot be written: a directory, under a file, unwritable."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a directory, not a file")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{what} {p}: no permission to write it")
    else:
        _check_parent(p, what)
    return p


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` holds a training run (config.json or meta.json of `sanlab train`)."""
    return any((Path(path) / m).is_file() for m in RUN_DIR_MARKERS)


def no_space(err: BaseException) -> bool:
    """Whether an error from a write means the disk (or quota) is full.

    safetensors reports the OS error inside its own exception's text, hence the text test.
    """
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text


def raise_no_space(err: BaseException, what: str) -> None:
    """Turn a full-disk error into `NoSpaceError` (one line, its own exit code); else do nothing."""
    if no_space(err):
        raise NoSpaceError(f"no space left on the device while writing {what}") from None


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A fresh temp dir beside `out` to build into. When the block finishes without an
    error the temp dir replaces `out` (an old `out` is removed only after the swap, so a
    kill at any instant leaves the old or the new one whole); it is removed in any case."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
