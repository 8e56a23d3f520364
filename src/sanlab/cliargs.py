"""Command-line flags: the parser every command uses and the types of its number flags.

Part of the one validation layer every input passes through (`sanlab.config` for
configs and overrides, `sanlab.paths` for output locations, this module for flags):

- `ArgumentParser`: a usage mistake (unknown flag, missing argument, a flag value of
  the wrong type) raises `ConfigError`, so it ends like every other user error, as one
  `sanlab: error: …` line with exit code 2; `section.key=value` overrides are accepted
  anywhere on the line, also after the flags (`sanlab study run SPEC --out DIR k=v`).
  Every `type=Path` argument passes `sanlab.paths.check_in_path` as it is parsed: an
  empty one (`--hf ''`, which `Path` would read as the current directory), a name too
  long for the filesystem, a symlink loop or a dangling symlink is refused by name.
- `finite_float`, `positive_int`, `int_list`, `device_name`, …: argparse `type=` callables
  that refuse NaN, ±inf, out-of-range numbers, non-numbers and unknown devices before any
  work starts.
- `script_main`: the same contract for the scripts outside the `sanlab` command
  (`benchmarks/`, `scripts/`): a user error ends as one `PROG: error: …` line.

No heavy imports here: building a parser must stay instant.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from sanlab.errors import ConfigError, SanlabError
from sanlab.paths import check_in_path


class ArgumentParser(argparse.ArgumentParser):
    """argparse with sanlab's error contract (see the module docstring)."""

    def error(self, message: str) -> NoReturn:
        # (a subcommand names itself; `sanlab` and a script's `script_main` name the program)
        where = f"{self.prog.removeprefix('sanlab ')}: " if self.prog.startswith("sanlab ") else ""
        raise ConfigError(f"{where}{message} (see `{self.prog} --help`)")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if action.type is Path:
            what = action.option_strings[0] if action.option_strings else str(action.metavar or action.dest)
            check_in_path(arg_string, what)
        return super()._get_value(action, arg_string)  # type: ignore[misc]

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        # argparse stops filling a `nargs="*"` positional at the first flag; overrides
        # written after the flags belong to it all the same.
        overrides = next((a for a in self._actions if not a.option_strings and a.nargs == "*"
                          and a.type is None and isinstance(getattr(ns, a.dest, None), list)), None)
        if overrides is not None:
            moved = [e for e in extras if "=" in e and not e.startswith("-")]
            if moved:
                getattr(ns, overrides.dest).extend(moved)
                extras = [e for e in extras if e not in moved]
        return ns, extras


def _number(kind: Callable[[str], Any], text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def bounded(kind: Callable[[str], Any] = float, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, hi_open: bool = False) -> Callable[[str], Any]:
    """An argparse type: a finite `kind` (float or int) in the given range."""

    def parse(text: str) -> Any:
        value = _number(kind, text)
        low_bad = lo is not None and (value <= lo if lo_open else value < lo)
        high_bad = hi is not None and (value >= hi if hi_open else value > hi)
        if low_bad or high_bad:
            parts = []
            if lo is not None:
                parts.append(f"{'>' if lo_open else '>='} {lo:g}")
            if hi is not None:
                parts.append(f"{'<' if hi_open else '<='} {hi:g}")
            raise argparse.ArgumentTypeError(f"must be {' and '.join(parts)}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


finite_float = bounded(float)
non_negative_float = bounded(float, lo=0)
positive_int = bounded(int, lo=1)
non_negative_int = bounded(int, lo=0)


def int_list(lo: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each >= `lo` ("32,128,512")."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if any(v < lo for v in values):
            raise argparse.ArgumentTypeError(f"every value must be >= {lo}, got {text!r}")
        return values

    parse.__name__ = "integer list"
    return parse


def device_name(text: str) -> str:
    """An argparse type: `cpu`, `cuda` or `cuda:N` (whether the device exists is the command's check)."""
    if text == "cpu" or re.fullmatch(r"cuda(:[0-9]+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")


def script_main(main: Callable[[], int | None]) -> int:
    """A script's entry (`raise SystemExit(script_main(main))`): `main`'s exit code, or, for a
    user error (`SanlabError`: a flag's value through `ArgumentParser`, a config its flags
    build through `sanlab.config.validate`), one `PROG: error: …` line and the error's code,
    as `sanlab`'s commands end; Ctrl-C is exit 130 without a traceback."""
    prog = os.path.basename(sys.argv[0])
    try:
        return int(main() or 0)
    except SanlabError as e:
        print(f"{prog}: error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
