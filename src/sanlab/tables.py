"""One rendering layer for every table a command prints.

A command builds its tables as plain data (`Table`: a title, columns, rows of cell
strings, optional section breaks and emphasised cells) and hands them, with any lines of
prose (`Output.note`), to an `Output`, which writes them in the format the user asked for
with `--format` (`add_format_flag`):

    text   rich box tables. On a terminal they fit its width: words fold onto a second
           line, a number never does (right-aligned columns are numbers and never wrap);
           when the table still does not fit, its last columns are left out and a note
           under it names them. Off a terminal (a file, a pipe, CI) a table
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
           "notes": [...]}.

csv and json hold data, not display strings: one value per field, numbers as numbers
(`200138`, not "200,138"; empty / null for a missing "—"). A cell that shows several
values (`Cell`, e.g. "−0.31 ± 0.01" or one Δ per seed) is one field per value, named
`COLUMN KEY` ("Δ mean", "Δ sd"); an emphasised cell (the sweep's best) adds a boolean
field `COLUMN best`. A plain cell that reads as a number becomes that number.

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
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Literal, Sequence

from sanlab.errors import ConfigError

FORMATS = ("text", "md", "csv", "json")
Justify = Literal["left", "right", "center"]
DEFAULT_WIDTH = 80  # off a terminal, without COLUMNS


@dataclass(frozen=True)
class Cell:
    """A cell shown as `text` that holds data for csv and json: `value` (one number,
    bool, string or None), or `fields` (several, each its own field: {"mean": m, "sd": s})."""

    text: str
    value: Any = None
    fields: dict[str, Any] | None = None


_NUMBER = re.compile(r"[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][+-]?\d+)?")


def cell_value(text: str) -> Any:
    """A plain cell's data: a number when it reads as one ("200,138", "−0.0703", "1e-05"),
    None when empty or missing ("—"), else the text."""
    t = text.strip().replace("\u2212", "-")
    if t in ("", "—", "–"):
        return None
    if _NUMBER.fullmatch(t):
        t = t.replace(",", "")
        return int(t) if re.fullmatch(r"[+-]?\d+", t) else float(t)
    return text


@dataclass
class Column:
    name: str
    justify: Justify = "left"
    spare: int = 0  # on a narrow terminal the columns with the highest `spare` are left out first
    field: str | None = None  # csv / json: the name its values' fields start with (default: `name`)
    flagged: bool = False  # csv / json: a `NAME best` field (is the cell emphasised) even when none is


@dataclass
class Table:
    """A table as data: what every format renders. Cells are display strings."""

    title: str
    columns: list[Column] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    sections: set[int] = field(default_factory=set)  # row indices with a rule above them
    bold: set[tuple[int, int]] = field(default_factory=set)  # (row, column) cells to emphasise
    notes: list[str] = field(default_factory=list)  # lines printed right under the table
    data: list[list[Any]] = field(default_factory=list)  # per row, each cell's value or {key: value}

    def column(self, name: str, justify: Justify = "left", *, spare: int = 0, field: str | None = None,
               flagged: bool = False) -> "Table":
        self.columns.append(Column(name, justify, spare, field, flagged))
        return self

    def add_row(self, *cells: Any, bold: Iterable[int] = ()) -> None:
        """A row of cells: strings (or anything `str()` shows), None for an empty cell, or
        `Cell`s that carry their data."""
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(cells)} cells for {len(self.columns)} columns")
        i = len(self.rows)
        self.rows.append([c.text if isinstance(c, Cell) else "" if c is None else str(c) for c in cells])
        self.data.append([(c.fields if c.fields is not None else c.value) if isinstance(c, Cell)
                          else cell_value("" if c is None else str(c)) for c in cells])
        self.bold.update((i, j) for j in bold)

    def fields(self) -> list[tuple[str, int, str | None]]:
        """The csv / json fields: (name, column, key of a several-valued cell, or "best" for
        the emphasis flag, or None)."""
        out: list[tuple[str, int, str | None]] = []
        for j, col in enumerate(self.columns):
            name = col.field or col.name.replace("\n", " ")
            keys = list(dict.fromkeys(k for row in self.data if isinstance(row[j], dict) for k in row[j]))
            out += [(f"{name} {k}", j, k) for k in keys] if keys else [(name, j, None)]
            if col.flagged or any(jj == j for _, jj in self.bold):
                out.append((f"{name} best", j, "best"))
        return out

    def records(self) -> list[list[Any]]:
        """The rows as data, one value per field of `fields()`."""
        out = []
        for i, row in enumerate(self.data):
            vals = []
            for _, j, key in self.fields():
                v = row[j]
                if key == "best":
                    vals.append((i, j) in self.bold)
                elif key is not None:
                    vals.append(v.get(key) if isinstance(v, dict) else None)
                else:
                    vals.append(None if isinstance(v, dict) else v)
            out.append(vals)
        return out

    def add_section(self) -> None:
        """A rule before the next row (e.g. the noise floor under the gaps)."""
        self.sections.add(len(self.rows))

    def to_dict(self) -> dict[str, Any]:
        """The table as data (json's form): field names and typed rows."""
        out: dict[str, Any] = {"title": self.title, "columns": [f for f, _, _ in self.fields()],
                               "rows": self.records()}
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
            shown, left_out = fit_columns(t, c.width)
            c.print(rich_table(shown, widths=column_widths(shown, c.width)))
            if left_out:
                from rich.text import Text

                c.print(Text(f"note: column(s) {', '.join(left_out)} left out to fit {c.width} columns "
                             "(a wider terminal, or --format md|csv|json, shows them)"), style="dim")
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


def _min_width(t: Table, j: int) -> int:
    """The narrowest column `j` can be: a number (right-aligned) whole, text at its longest word."""
    whole = t.columns[j].justify == "right"
    texts = [t.columns[j].name] + [row[j] for row in t.rows]
    return max((len(w) for x in texts for w in ([x] if whole else x.split()) or [""]), default=0)


def fit_columns(t: Table, width: int) -> tuple[Table, list[str]]:
    """`t` without as many columns as it takes to fit `width` with no number and no word
    split, and the names of those left out: the most `spare` first, then the last (the
    first column always stays)."""
    keep = list(range(len(t.columns)))
    order = sorted(keep[1:], key=lambda j: (-t.columns[j].spare, -j))
    while len(keep) > 1 and sum(_min_width(t, j) for j in keep) + 3 * len(keep) + 1 > width:
        keep.remove(order.pop(0))
    if len(keep) == len(t.columns):
        return t, []
    keep.sort()
    sub = Table(t.title, [t.columns[j] for j in keep], [[row[j] for j in keep] for row in t.rows], set(t.sections),
                {(i, keep.index(j)) for i, j in t.bold if j in keep}, list(t.notes),
                [[row[j] for j in keep] for row in t.data])
    return sub, [t.columns[j].name.replace("\n", " ") for j in range(len(t.columns)) if j not in keep]


def column_widths(t: Table, width: int) -> list[int]:
    """Widths that fit `width` (when `fit_columns` says they can): a number column as wide
    as its widest cell, each text column at least its longest word, the room left shared
    among text columns up to their natural width, left to right."""
    natural = [max(len(x) for x in [c.name, *(row[j] for row in t.rows)]) for j, c in enumerate(t.columns)]
    widths = [_min_width(t, j) for j in range(len(t.columns))]
    room = width - (3 * len(widths) + 1) - sum(widths)
    for j in range(len(widths)):
        give = max(0, min(room, natural[j] - widths[j]))
        widths[j] += give
        room -= give
    return widths


def rich_table(t: Table, *, title: bool = True, star: bool = False, widths: list[int] | None = None) -> Any:
    """The rich Table of `t` (cells as plain text: no markup is interpreted). With `star`
    (plain text, where bold does not show) an emphasised cell ends in `*`; `widths`: each
    column's width (see `column_widths`), else rich's own layout."""
    from rich.table import Table as RichTable
    from rich.text import Text

    r = RichTable(title=(t.title or None) if title else None)
    for j, col in enumerate(t.columns):
        r.add_column(col.name, justify=col.justify, overflow="fold", no_wrap=col.justify == "right",
                     width=widths[j] if widths is not None else None)
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
    w.writerow([f for f, _, _ in t.fields()])
    w.writerows([["" if v is None else v for v in row] for row in t.records()])
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
