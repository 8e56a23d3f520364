"""What every kind of record shares: its layout, its error, the claim and its three
verdicts, the paper's numbers in this project's sign, and the Markdown helpers the blocks
are written with."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from sanlab import fileio
from sanlab.config import format_tokens
from sanlab.errors import DataError
from sanlab.study.noise import mean_spread, nats

STUDY = "study"
REPORT = "report"
README = "README.md"
CONFIG = "record.toml"  # hand-written: compare_with, prediction
MARKER = "record.json"  # written by `sanlab record export`: what makes a dir a record
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
# A check of the analysis (true by construction when the code is right) is not a claim of
# the paper: it holds or not, and is never counted with the claims.
HOLDS, DOES_NOT_HOLD, NOT_CHECKED = "holds", "does not hold", "not checked"


@dataclass
class Claim:
    """One row of a claims block: a claim of a paper, its number, what the record measured,
    and the verdict by the rule of the unit that made it (`ClaimSet`): `rule` is the unit's
    key, `check` whether it is a check of the analysis rather than a claim."""

    claim: str
    paper: str
    measured: str
    verdict: str
    rule: str = ""
    check: bool = False


RowFn = TypeVar("RowFn", bound=Callable[..., "Claim | None"])


@dataclass(frozen=True)
class ClaimUnit:
    """One claim as a record reads it: its key, the name docs/records.md gives it, its rule
    (the text the README prints under the claims table and the docs render), and `row`, the
    function that reads its inputs from the record and returns the row with its verdict by
    that rule (None: the claim does not apply to this record)."""

    key: str
    title: str
    rule: str
    row: Callable[..., Claim | None]
    check: bool = False  # a check of the analysis: listed apart, not a claim
    note: str = ""  # the docs' words beyond the rule (an example, a caveat)


class ClaimSet:
    """A kind's claims, in the order its README lists them. Adding a claim is one edit: a
    function under the decorator, its rule beside it.

        CLAIMS = ClaimSet(__name__, PREAMBLE)

        @CLAIMS.claim("ordering", "Ordering", "ordering: per seed pair, …; reproduced when …")
        def ordering(rec: StudyRecord) -> Claim:
            ...
            return Claim(name, paper, measured, verdict)

    The README's claims block (`table`) and docs/records.md's rules (`markdown`, written by
    `python -m sanlab.configref --write-docs`) both come from the units."""

    def __init__(self, where: str, preamble: str) -> None:
        self.where, self.preamble = where, preamble
        self.units: list[ClaimUnit] = []

    def claim(self, key: str, title: str, rule: str, *, check: bool = False, note: str = "") -> Callable[[RowFn], RowFn]:
        def wrap(fn: RowFn) -> RowFn:
            if any(u.key == key for u in self.units):
                raise ValueError(f"{self.where}: claim {key!r} declared twice")
            self.units.append(ClaimUnit(key, title, rule, fn, check, note))
            return fn

        return wrap

    @property
    def rules(self) -> dict[str, str]:
        return {u.key: u.rule for u in self.units}

    def rows(self, *inputs: Any) -> list[Claim]:
        """Every unit's row on `inputs` (the record), in order; each row carries its unit's key."""
        out = []
        for u in self.units:
            row = u.row(*inputs)
            if row is not None:
                out.append(replace(row, rule=u.key, check=u.check))
        return out

    def table(self, rows: list[Claim], note: str, paper: str = "paper (our sign)") -> str:
        return claims_table(rows, note, self.rules, self.preamble, self.where, paper)

    def markdown(self) -> str:
        """The rules as docs/records.md lists them: the claims, then the checks."""
        def item(u: ClaimUnit) -> str:
            # the rule's own label ("ordering: …", as the README lists it) gives way to the title
            return f"- **{u.title}**: {u.rule.split(': ', 1)[-1]}" + (f" {u.note}" if u.note else "")

        out = [item(u) for u in self.units if not u.check]
        checks = [item(u) for u in self.units if u.check]
        if checks:
            out += ["", "Checks of the analysis (not claims; never counted among them):", "", *checks]
        return "\n".join(out)


def ordering_verdict(signs: Iterable[int]) -> str:
    """An ordering read step by step, each step's sign by the noise rule (+1: in the paper's
    direction and beyond noise): reproduced when every step is, not reproduced when any
    step is reversed beyond noise, else inconclusive (also without steps)."""
    s = list(signs)
    if s and all(x == 1 for x in s):
        return REPRODUCED
    if any(x == -1 for x in s):
        return NOT_REPRODUCED
    return INCONCLUSIVE

class RecordError(DataError):
    """A missing or corrupt study dir, record dir or README."""


def read_json(path: Path) -> Any:
    return fileio.read_json(path, RecordError)


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


def mean_sd(xs: Iterable[float]) -> tuple[float | None, float | None]:
    """(mean, sample sd) as the study computes them (`sanlab.study.noise.mean_spread`)."""
    return mean_spread(xs)


# --------------------------------------------------------------------------- rendering helpers


def fmt(x: float | None, f: str = "{:+.4f}") -> str:
    return "–" if x is None or not finite(x) else f.format(x).replace("-", "−")


def fmt_floor(x: float | None) -> str:
    """A noise floor's size F in nats: four decimals, or two significant digits where it
    would round to 0.0000 (a deterministic CPU in fp32; `sanlab.study.noise.nats`)."""
    return "–" if x is None or not finite(x) else nats(x, signed=False)


def fmt_ms(xs: Iterable[float], f: str = "{:+.4f}") -> str:
    """mean ± sample sd (the mean alone for one value; – for none)."""
    m, sd = mean_sd(xs)
    if m is None:
        return "–"
    return fmt(m, f) + ("" if sd is None else f" ± {sd:.4f}")


def fmt_tokens(n: int) -> str:
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


def per_seed(g: dict[str, Any] | None, key: str = "per_seed") -> dict[int, float]:
    """Seed -> value of a gap's per-seed field (`per_seed`: Δ; `reference_per_seed`,
    `arm_per_seed`: the losses)."""
    return {int(s): float(v) for s, v in ((g or {}).get(key) or {}).items() if finite(v)}


def paired(*series: dict[int, float]) -> list[int]:
    """The seeds every series has, in order."""
    if not series:
        return []
    common = set(series[0]).intersection(*series[1:])
    return sorted(common)


def per_seed_text(g: dict[str, Any] | None) -> str:
    if g is None or not g.get("per_seed"):
        return "–"
    return " ".join(f"s{s}: {fmt(v)}" for s, v in sorted(g["per_seed"].items(), key=lambda kv: int(kv[0])))


def rows_of(c: dict[str, Any], grouping: str) -> dict[str, dict[str, Any]]:
    return {r["group"]: r for r in ((c.get(grouping) or {}).get("rows") or [])}


SIGN_NOTE = ("Δ = arm − SAN validation loss (nats); Δ < 0: the standard arm is ahead. The paper writes "
             "SAN − FFN; its numbers are shown negated to this sign.")


def claims_table(rows: list[Claim], note: str, rules: dict[str, str], preamble: str, where: str,
                 paper: str = "paper (our sign)") -> str:
    """A claims block: the claims' table, the checks' table (checks of the analysis, apart so
    that no count of the claims includes them), then the rules of the rows (each once)."""
    claims, checks = [c for c in rows if not c.check], [c for c in rows if c.check]
    out = [note, md_table(["claim", paper, "measured", "verdict"],
                          [[c.claim, c.paper, c.measured, f"**{c.verdict}**"] for c in claims])]
    if checks:
        out += ["Checks of the analysis (exact by construction, so not claims of the paper and not counted "
                "among them):",
                md_table(["check", "expected", "measured", "result"],
                         [[c.claim, c.paper, c.measured, f"**{c.verdict}**"] for c in checks])]
    keys = list(dict.fromkeys(c.rule for c in rows if c.rule in rules))
    out.append(f"Verdict rules (`{where}`): {preamble}\n\n" + "\n".join(f"- {rules[k]}" for k in keys))
    return "\n\n".join(out)
