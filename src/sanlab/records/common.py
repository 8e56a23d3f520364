"""What every part of a record shares: its layout, its error, the paper's numbers in this
project's sign, and the Markdown helpers the blocks are written with."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from sanlab.errors import DataError

STUDY = "study"
REPORT = "report"
README = "README.md"
CONFIG = "record.toml"
DATA_FILES = ("manifest.json", "entropy_floor.json", "tokenizer.json")  # the small files of a data dir
RUN_FILES = ("config.json", "meta.json", "metrics.jsonl")
TOP_FILES = ("study.json", "results.jsonl", "speed.json")
CONFIG_KEYS = {"compare_with", "prediction"}

# The paper's numbers (SPEC §1.6) in this project's sign: Δ = standard arm − SAN.
PAPER_GAP = {"iso-param": -0.0055, "iso-FLOP": -0.263, "iso-depth": -0.470}
PAPER_GAP_TEXT = {
    "iso-param": "−0.0055 at 105B (−0.046 at 5B, −0.019 at 30B)",
    "iso-FLOP": "−0.263 at 105B",
    "iso-depth": "−0.470 at 105B",
}
PAPER_ISO_PARAM_BY_BUDGET = {5_000_000_000: -0.046, 30_000_000_000: -0.019, 105_000_000_000: -0.0055}
REGIONS = ("query", "trace", "answer", "other")
PAPER_TOKEN_SHARE = {"query": 5.8, "trace": 57.2, "answer": 35.9}
PAPER_LOSS_SHARE = {"query": 7.9, "trace": 55.4, "answer": 36.6}
PAPER_REGION_DELTA = {
    "query": "−0.052 (31B), −0.038 (105B)",
    "trace": "−0.008 (31B); favours the SAN at 105B",
    "answer": "favours the SAN at 105B",
}
MATRIX_TYPES = ("Q", "K", "V", "O", "down")
ROUTING, CONTENT = ("Q", "K"), ("V", "O", "down")
IDENTITY_TOL = 0.02

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

class RecordError(DataError):
    """A missing or corrupt study dir, record dir or README."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not readable JSON ({e})") from None


def write_text(path: Path, text: str, like: Path | None = None) -> None:
    """Atomic write; keeps `like`'s modification time (the report orders analyses by it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    if like is not None:
        st = like.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)

# --------------------------------------------------------------------------- numbers and rules


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_sd(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


# --------------------------------------------------------------------------- rendering helpers


def fmt(x: float | None, f: str = "{:+.4f}") -> str:
    return "–" if x is None or not finite(x) else f.format(x).replace("-", "−")


def fmt_ms(xs: list[float]) -> str:
    m, sd = mean_sd(xs)
    if m is None:
        return "–"
    return fmt(m) + ("" if sd is None else f" ± {sd:.4f}")


def fmt_tokens(n: int) -> str:
    from sanlab.config import format_tokens

    return format_tokens(n)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def arm_label(g: dict[str, Any]) -> str:
    return f"{g['arm']} ({g['role']})"


def per_seed_values(g: dict[str, Any]) -> list[float]:
    return [float(v) for _, v in sorted(g.get("per_seed", {}).items(), key=lambda kv: int(kv[0]))]


def per_seed_text(g: dict[str, Any] | None) -> str:
    if g is None or not g.get("per_seed"):
        return "–"
    return " ".join(f"s{s}: {fmt(v)}" for s, v in sorted(g["per_seed"].items(), key=lambda kv: int(kv[0])))


def rows_of(c: dict[str, Any], grouping: str) -> dict[str, dict[str, Any]]:
    return {r["group"]: r for r in ((c.get(grouping) or {}).get("rows") or [])}


SIGN_NOTE = ("Δ = arm − SAN validation loss (nats); Δ < 0: the standard arm is ahead. The paper writes "
             "SAN − FFN; its numbers are shown negated to this sign.")

