"""One reader per file format: JSON, JSON Lines and TOML.

Every file sanlab reads back (configs, run dirs, study dirs, records, manifests) is read
through these, so a damaged file ends the same way whatever the damage: bytes that are
not UTF-8, text that is not JSON / TOML, nesting too deep for the parser (a TOML or JSON
value nested 100,000 deep), or a file that cannot be read. Each is one `SanlabError` line
naming the file and what is wrong with it (the caller picks the error class, and so the
context its message gets), never a traceback.

JSON Lines (`metrics.jsonl`, `results.jsonl`) are read line by line from bytes: a damaged
line (torn by a kill, not UTF-8, not a JSON object) is that line's problem only, reported
as None for the line, never a failure of the file.

No heavy imports here.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Iterator

from sanlab.errors import DataError, SanlabError


def _read_text(path: Path, kind: str, error: type[SanlabError]) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: malformed {kind} (not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def parse_json(text: str | bytes) -> Any:
    """`json.loads` whose every failure is a `ValueError` (a RecursionError for deep nesting
    and a UnicodeDecodeError for bytes included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json(path: str | Path, error: type[SanlabError] = DataError, what: str = "JSON") -> Any:
    """The JSON value in `path`; `error` (one line naming the file and the damage: "FILE:
    malformed {what} (…)") when it cannot be read, is not UTF-8 or is not JSON."""
    p = Path(path)
    text = _read_text(p, what, error)
    try:
        return parse_json(text)
    except ValueError as e:  # JSONDecodeError is one
        raise error(f"{p}: malformed {what} ({e})") from None


def read_json_object(path: str | Path, error: type[SanlabError] = DataError) -> dict[str, Any]:
    """`read_json` of a file that must hold a JSON object."""
    data = read_json(path, error)
    if not isinstance(data, dict):
        raise error(f"{path}: malformed JSON (a {type(data).__name__}, not an object)")
    return data


def try_read_json_object(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing or damaged in any way."""
    try:
        return read_json_object(path)
    except SanlabError:
        return None


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """One JSON Lines record, or None when the line is damaged (not UTF-8 JSON, not an object)."""
    try:
        rec = parse_json(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return rec if isinstance(rec, dict) else None


def read_jsonl(path: str | Path, error: type[SanlabError] = DataError) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
    """(1-based line number, its bytes, its record or None when damaged) of every non-blank
    line of `path` (nothing when it is missing); `error` only when the file cannot be read."""
    p = Path(path)
    if not p.is_file():
        return
    try:
        data = p.read_bytes()
    except OSError as e:
        raise error(f"{p}: cannot be read ({e.strerror or e})") from None
    for i, raw in enumerate(data.split(b"\n"), 1):
        if raw.strip():
            yield i, raw, parse_line(raw)


def read_toml(path: str | Path, error: type[SanlabError]) -> dict[str, Any]:
    """The tables of a TOML file; `error` (one line) when it is missing, unreadable, not
    UTF-8, not TOML or nested too deeply for the parser."""
    p = Path(path)
    if not p.is_file():
        raise error(f"config file not found: {p}")
    text = _read_text(p, "TOML", error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{p}: malformed TOML: {e}") from None
    except RecursionError:
        raise error(f"{p}: malformed TOML: nested too deeply") from None
