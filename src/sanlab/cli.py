"""`sanlab <command>`: a thin dispatcher.

Each command lives in its own module, which defines
    configure(parser: argparse.ArgumentParser) -> None
    run(args: argparse.Namespace) -> int
Only the chosen command's module is imported, so `sanlab --help` is instant and
importing one command never drags in another's dependencies.

User errors (`SanlabError`, argparse's usage errors included: `sanlab.cliargs`) print
one line and exit with the error's code (2, or e.g. 5 for a full disk); anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from sanlab import __version__
from sanlab.cliargs import ArgumentParser
from sanlab.errors import EXIT_NO_SPACE, EXIT_USAGE, SanlabError
from sanlab.paths import no_space

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "match": ("sanlab.commands.match", "matched arms for a reference model (params, FLOPs, depth)"),
    "prepare": ("sanlab.data.prepare", "tokenize and pack a corpus into shards"),
    "train": ("sanlab.train.cli", "train one run into a run directory"),
    "study": ("sanlab.commands.study", "plan, run and tabulate a controlled study"),
    "analyze": ("sanlab.analysis.cli", "decompose the gap between runs (regions, spectra, attention)"),
    "signal": ("sanlab.commands.signal", "residual-stream growth with depth at init (Theorem 1)"),
    "eval": ("sanlab.eval.cli", "zero-shot lm-eval tasks (and built-in offline ones) on run dirs"),
    "sample": ("sanlab.commands.sample", "generate text from a run's checkpoint (KV cache, streaming)"),
    "report": ("sanlab.report.cli", "a study's figures and tables: PNGs, report.md, one self-contained report.html"),
    "probe": ("sanlab.probes.cli", "what an architecture can do at all: synthetic probe tasks (SPEC §2)"),
    "record": ("sanlab.records.cli", "commit a finished study as a record; its README's tables from its results"),
    "export": ("sanlab.hf.export_cli", "a run's checkpoint as a 🤗 transformers folder (--hf OUT)"),
    "import": ("sanlab.hf.import_cli", "a folder written by `sanlab export --hf` back into a run dir"),
}


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="sanlab",
        description="Controlled architecture studies of language models.",
    )
    parser.add_argument("--version", action="version", version=f"sanlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        print(f"sanlab: error: unknown command {command!r} (choose from {', '.join(COMMANDS)})",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        parser = _build_parser(command)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        module = importlib.import_module(COMMANDS[args.command][0])
        return int(module.run(args) or 0)
    except SanlabError as e:
        message = " ".join(str(e).splitlines())  # one line, whatever the message holds
        print(f"sanlab: error: {message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("sanlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `sanlab … | head`: the reader left; silence the flush at exit (Python docs recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:  # after BrokenPipeError, which is one
        if not no_space(e):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"sanlab: error: no space left on the device{where}", file=sys.stderr)
        return EXIT_NO_SPACE


OWN_PROCESS = False  # True when sanlab's entry point runs the command: the process is the command's own


def entry() -> None:
    global OWN_PROCESS
    OWN_PROCESS = True
    sys.exit(main())


if __name__ == "__main__":
    entry()
