"""Output locations, checked before any work starts.

Every command that writes (`prepare`, `train`, `study run`, `analyze`, `signal --json`)
passes its destination through `check_out_dir` / `check_out_file` first, so a
destination that cannot be written is one `sanlab: error: …` line (exit 2) naming it
instead of an `OSError` traceback after minutes of work:

- an existing file where a directory is wanted (or a directory where a file is);
- a path under a file (`out.txt/run`);
- a directory this process may not write in (permissions, a read-only filesystem, `/proc`);
- a path the filesystem cannot hold: empty, a name over its NAME_MAX (with room for the
  temp name a staged write puts beside it), the whole over its PATH_MAX (with room for
  the files a command writes inside);
- a symlink loop or a dangling symlink anywhere on the path;
- for a command that writes the directory whole (`whole=True`: it is swapped in by a
  rename), the current directory or one holding it.

`check_in_path` is the same first step for a path that is read (empty, too long, a loop),
so the reader's own "not found" answers the rest.

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


STAGING_ROOM = 24  # bytes a name needs beside it: `.NAME.export-PID` (see `staged_dir`, records.export)
INSIDE_ROOM = 256  # bytes of path a command writes below its output dir (checkpoints/.tmp-…/model.safetensors)


def _limit(anc: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(anc, name))
    except (OSError, ValueError):
        return default


def _short(name: str) -> str:
    return name if len(name) <= 24 else name[:20] + "…"


def check_path(path: str | Path, what: str, *, room: bool = True) -> Path:
    """The checks every user path gets before it is used, read or written: not empty, each
    name and the whole within the filesystem's limits (with `room`, leaving room for a temp
    name beside the last one and for files inside), no symlink loop or dangling symlink on
    the way. `ConfigError` (one line naming the path) otherwise."""
    if isinstance(path, str) and not path:
        raise ConfigError(f"{what}: an empty path (give a directory or file name)")
    p = Path(path)
    full = os.path.abspath(p)
    parts = Path(full).parts
    anc = Path(parts[0])  # the deepest existing directory on the way, whose filesystem sets the limits
    for part in parts[1:]:
        if not os.path.isdir(anc / part):  # os.path's tests answer False for a name too long, never raise
            break
        anc = anc / part
    name_max = _limit(anc, "PC_NAME_MAX", 255)
    path_max = _limit(anc, "PC_PATH_MAX", 4096)
    for i, part in enumerate(parts[1:], 1):
        limit = name_max - (STAGING_ROOM if room and i == len(parts) - 1 else 0)
        if len(os.fsencode(part)) > limit:
            raise ConfigError(f"{what} {_short(str(p))}: the name {_short(part)!r} is {len(os.fsencode(part))} "
                              f"bytes, over the {limit} bytes this filesystem allows"
                              + (f" (its limit {name_max}, less room for a temp name beside it)"
                                 if limit != name_max else ""))
    limit = path_max - (INSIDE_ROOM if room else 0)
    if len(os.fsencode(full)) > limit:
        raise ConfigError(f"{what} {_short(str(p))}: the path is {len(os.fsencode(full))} bytes, over the {limit} "
                          "bytes this filesystem allows" + (f" (its limit {path_max}, less room for the files inside)"
                                                      if room else ""))
    walked = Path(parts[0])
    for part in parts[1:]:
        walked = walked / part
        if not os.path.islink(walked):
            if not walked.exists():
                break
            continue
        try:
            os.stat(walked)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ConfigError(f"{what} {p}: {walked} is a symlink loop") from None
            if e.errno == errno.ENOENT:
                raise ConfigError(f"{what} {p}: {walked} is a dangling symlink (to {os.readlink(walked)}, "
                                  "which does not exist)") from None
            raise ConfigError(f"{what} {p}: {walked} cannot be followed ({e.strerror or e})") from None
    return p


def check_in_path(path: str | Path, what: str) -> Path:
    """`check_path` for a path that is only read."""
    return check_path(path, what, room=False)


def _check_not_cwd(p: Path, what: str) -> None:
    """A directory written whole is swapped in by a rename, which the current directory
    (or one holding it) cannot take."""
    here = Path(os.getcwd()).resolve()
    there = p.resolve()
    if here == there or here.is_relative_to(there):
        raise ConfigError(f"{what} {p}: is the current directory{'' if here == there else ' or holds it'}; "
                          "this command writes its output dir whole, so name one of its own (e.g. a new subdir)")


def check_out_dir(path: str | Path, what: str = "--out", *, whole: bool = False) -> Path:
    """Refuse an output directory that cannot be created or written (see the module
    docstring); `whole`: the command swaps the whole directory in (`staged_dir`)."""
    p = check_path(path, what)
    if whole:
        _check_not_cwd(p, what)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {p}: exists and is not a directory")
    if not p.exists():
        _check_parent(p, what)
    elif (why := _cannot_create_in(p)) is not None:
        raise ConfigError(f"{what} {p}: {why.replace(f' in {p}', ' in it')}")
    return p


def check_out_file(path: str | Path, what: str) -> Path:
    """Refuse an output file that cannot be written: a directory, under a file, unwritable,
    a path the filesystem cannot hold (`check_path`)."""
    p = check_path(path, what)
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
