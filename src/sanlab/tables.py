"""One rendering layer for every table a command prints.

A command builds its tables as plain data (`Table`: a title, columns, rows of cell
strings, optional section breaks and emphasised cells) and hands them, with any lines of
prose (`Output.note`), to an `Output`, which writes them in the format the user asked for
with `--format` (`add_format_flag`):

    text   rich box tables. On a terminal they fit its width (a cell too wide for it folds
           onto a second line; nothing is cut). Off a terminal (a file, a pipe, CI) a table
           is never cut and no cell is wrapped: it is laid out at COLUMNS (default 80) when
           it fits and at its own natural width when it does not; its title and the prose
           are written one line each, unwrapped, so `grep` finds them whole; an emphasised
           cell (the sweep's best) ends in `*` where bold cannot show.
    md     GitHub Markdown: each table as a pipe table under its bold title, prose as
           paragraphs (paste it into a README, an issue or a lab notebook).
    csv    each table as a CSV block: a `# title` line, the header, the rows; blocks apart
           by a blank line; prose as `# ` lines (`pandas.read_csv(f, comment="#")` reads a
           one-table output).
    json   one JSON object at the end: {"tables": [{"title", "columns", "rows", "notes"}],
           "notes": [...]}, every cell as the string the text table shows.

`--format` renders what is printed; a command's own `--json` (where it has one) is its
data, with raw numbers and more fields than the tables show.

Progress lines that are not part of the result (`Output.progress`) go to stderr in the
machine formats (csv, json), so stdout stays parseable.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Literal, Sequence

from sanlab.errors import ConfigError

FORMATS = ("text", "md", "csv", "json")
Justify = Literal["left", "right", "center"]
DEFAULT_WIDTH = 80  # off a terminal, without COLUMNS


@dataclass
class Column:
    name: str
    justify: Justify = "left"


@dataclass
class Table:
    """A table as data: what every format renders. Cells are display strings."""

    title: str
    columns: list[Column] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    sections: set[int] = field(default_factory=set)  # row indices with a rule above them
    bold: set[tuple[int, int]] = field(default_factory=set)  # (row, column) cells to emphasise
    notes: list[str] = field(default_factory=list)  # lines printed right under the table

    def column(self, name: str, justify: Justify = "left") -> "Table":
        self.columns.append(Column(name, justify))
        return self

    def add_row(self, *cells: Any, bold: Iterable[int] = ()) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(cells)} cells for {len(self.columns)} columns")
        i = len(self.rows)
        self.rows.append(["" if c is None else str(c) for c in cells])
        self.bold.update((i, j) for j in bold)

    def add_section(self) -> None:
        """A rule before the next row (e.g. the noise floor under the gaps)."""
        self.sections.add(len(self.rows))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"title": self.title, "columns": [c.name for c in self.columns], "rows": self.rows}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


class _FormatAction(argparse.Action):
    """Stores the format and that it was given, so `--json` can refuse it (`refuse_json_and_format`)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.format_given = True


def add_format_flag(parser: argparse.ArgumentParser) -> None:
    """`--format text|md|csv|json`: how the command's tables are printed (see the module doc)."""
    parser.add_argument("--format", choices=FORMATS, default="text", dest="format", action=_FormatAction,
                        help="how to print the tables: text (default; off a terminal never cut or "
                             "wrapped, COLUMNS honoured), md, csv or json; not with --json")


def refuse_json_and_format(args: argparse.Namespace) -> None:
    """A command's `--json` prints its data and `--format` its tables: one rule for all,
    given together they contradict each other, and neither wins silently."""
    if getattr(args, "json", False) and getattr(args, "format_given", False):
        raise ConfigError(f"--json and --format {args.format}: give one (--json prints the data, "
                          "--format how the tables are printed)")


def columns_env() -> int | None:
    """COLUMNS as a positive int, or None when unset or not a number."""
    raw = os.environ.get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


class Output:
    """Where a command's tables and prose go, in one format. Use as a context manager or
    call `close()` at the end (json writes its one document there)."""

    def __init__(self, fmt: str = "text", file: IO[str] | None = None, *, err: IO[str] | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        self.format = fmt
        self.file = file if file is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.tables: list[Table] = []
        self.notes: list[str] = []
        self._console: Any = None
        self._started = False

    @classmethod
    def to_console(cls, console: Any) -> "Output":
        """Text output onto an existing rich console (a study's progress console)."""
        out = cls("text", console.file)
        out._console = console
        return out

    # ------------------------------------------------------------------ text console

    @property
    def console(self) -> Any:
        """The rich console of the text format (a terminal's width, else COLUMNS or 80)."""
        if self._console is None:
            from rich.console import Console

            c = Console(file=self.file, highlight=False)
            if not c.is_terminal:
                c = Console(file=self.file, highlight=False, width=columns_env() or DEFAULT_WIDTH,
                            soft_wrap=True)
            self._console = c
        return self._console

    @property
    def is_terminal(self) -> bool:
        return self.format == "text" and bool(self.console.is_terminal)

    # ------------------------------------------------------------------ writing

    def table(self, t: Table) -> None:
        self.tables.append(t)
        if self.format == "text":
            self._text_table(t)
        elif self.format == "md":
            self._write(_md_table(t))
        elif self.format == "csv":
            self._write(_csv_table(t))
        for n in t.notes if self.format != "json" else ():
            self.note(n, _record=False)

    def note(self, text: str, *, style: str | None = None, _record: bool = True) -> None:
        """A line of prose that belongs to the result (a total, a warning, a footnote)."""
        if _record:
            self.notes.append(text)
        if self.format == "text":
            from rich.text import Text

            self.console.print(Text(text, style=style or ""))
        elif self.format == "md":
            self._write(text.replace("\n", "  \n") + "\n")
        elif self.format == "csv":
            self._write("".join(f"# {line}\n" for line in text.splitlines() or [""]))

    def progress(self, text: str) -> None:
        """A line about the work in progress, not part of the result: stdout in text and md,
        stderr in csv and json."""
        if self.format in ("csv", "json"):
            print(text, file=self.err, flush=True)
        elif self.format == "md":
            self._write(text + "\n")
        else:
            from rich.text import Text

            self.console.print(Text(text))

    def close(self) -> None:
        if self.format == "json":
            doc = {"tables": [t.to_dict() for t in self.tables], "notes": self.notes}
            self.file.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        self.file.flush()

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()

    def _write(self, text: str) -> None:
        """md / csv: blocks apart by one blank line."""
        if self._started and self.format in ("md", "csv"):
            self.file.write("\n")
        self._started = True
        self.file.write(text)

    def _text_table(self, t: Table) -> None:
        from rich.measure import Measurement

        c = self.console
        if c.is_terminal:
            c.print(rich_table(t))
            return
        # Off a terminal: the title on a line of its own (never wrapped into the table's
        # width), and the table at its natural width when COLUMNS is too narrow for it, so
        # no cell is ever cut or wrapped (a file has no right edge).
        from rich.text import Text

        r = rich_table(t, title=False, star=c.color_system is None)
        if t.title:
            c.print(Text(t.title, style="bold"), soft_wrap=True)
        need = Measurement.get(c, c.options.update(width=100_000), r).maximum
        width = c.width
        c.width = max(width, need)
        try:
            c.print(r, soft_wrap=False)
        finally:
            c.width = width


def rich_table(t: Table, *, title: bool = True, star: bool = False) -> Any:
    """The rich Table of `t` (cells as plain text: no markup is interpreted). With `star`
    (plain text, where bold does not show) an emphasised cell ends in `*`."""
    from rich.table import Table as RichTable
    from rich.text import Text

    r = RichTable(title=(t.title or None) if title else None)
    for col in t.columns:
        r.add_column(col.name, justify=col.justify, overflow="fold")
    for i, row in enumerate(t.rows):
        if i in t.sections and i > 0:
            r.add_section()
        r.add_row(*(Text(c + ("*" if star and (i, j) in t.bold else ""), style="bold" if (i, j) in t.bold else "")
                    for j, c in enumerate(row)))
    return r


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> str:
    align = {"left": "---", "right": "--:", "center": ":-:"}
    lines = [f"**{_md_cell(t.title)}**", ""] if t.title else []
    lines.append("| " + " | ".join(_md_cell(c.name) or " " for c in t.columns) + " |")
    lines.append("|" + "|".join(align[c.justify] for c in t.columns) + "|")
    for i, row in enumerate(t.rows):
        cells = [f"**{_md_cell(c)}**" if (i, j) in t.bold and c else _md_cell(c) for j, c in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _csv_table(t: Table) -> str:
    buf = io.StringIO()
    if t.title:
        buf.write("".join(f"# {line}\n" for line in t.title.splitlines()))
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.name.replace("\n", " ") for c in t.columns])
    w.writerows(t.rows)
    return buf.getvalue()


def simple(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
           justify: Sequence[Justify] | None = None) -> Table:
    """A table from column names and rows; the first column left, the others right unless
    `justify` says otherwise."""
    t = Table(title)
    for i, name in enumerate(columns):
        t.column(name, justify[i] if justify is not None else ("left" if i == 0 else "right"))
    for row in rows:
        t.add_row(*row)
    return t
