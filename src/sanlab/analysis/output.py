"""Writing `sanlab analyze` results (JSON + CSV) and printing them as tables (`sanlab.tables`).

Files in the output dir (every CSV has a `run` column; NaN is written empty):

    analysis.json              everything below plus the sample description and timings
    losses.csv                 run, grouping, group, tokens, token_share, loss, loss_share,
                               entropy_floor, loss_above_floor (region / exercise rows, where
                               the data has an entropy floor; empty otherwise)
    deltas.csv                 run, vs, grouping, group, tokens, token_share, loss_a, loss_b,
                               delta, weighted, contribution, delta_lo, delta_hi (95% per-token
                               bootstrap interval of delta; region and exercise rows)
    delta_identity.csv         run, vs, grouping, aggregate_delta, weighted_sum, abs_error, rel_error
    spectra.csv                run, milestone, layer, type, stable_rank, effective_rank, spectral_norm
    spectra_by_type.csv        run, milestone, type, layers, stable_rank, effective_rank, spectral_norm
    crystallisation.csv        run, type, milestone (empty: never settled), tol, distances,
                               rank_changes (spectrum shape and stable-rank change per step)
    attention_heads.csv        run, layer, head, entropy, concentration, sink, local_0 … local_3
    attention_layers.csv       run, layer, head_diversity and the head means of the above
    stream.csv                 run, hook, rms, max_abs, rep_rank
    gates.csv                  run, layer, attn, ffn (σ(g), α, 1 or empty)

A grouping is `region`, `exercise`, `position` or `frequency`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

from sanlab.errors import DataError
from sanlab.fileio import read_json
from sanlab.tables import Output, Table

MILESTONE_NAME = re.compile(r"^milestone-(\d{3})$")  # a milestone checkpoint, and its analysis dir
MILESTONES_DIR = "milestones"  # ANALYSIS/GROUP/milestones/milestone-NNN/: a final pair group's milestone analyses

# A region or exercise type with fewer scored tokens in the sample is too thin to read (the
# tables say so, the report greys it, `--eval-rows auto` takes enough rows). Here, not in
# sanlab.analysis.evaluate, so that the report reads it without importing torch.
MIN_GROUP_TOKENS = 200


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN / inf become null (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _write_csv(path: Path, rows: list[dict]) -> Path | None:
    if not rows:
        return None
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v for k, v in r.items()})
    os.replace(tmp, path)
    return path


def tables(result: dict) -> dict[str, list[dict]]:
    """The CSV tables of a result, as lists of flat rows."""
    t: dict[str, list[dict]] = {k: [] for k in (
        "losses", "deltas", "delta_identity", "spectra", "spectra_by_type", "crystallisation",
        "attention_heads", "attention_layers", "stream", "gates",
    )}  # fmt: skip
    for name, r in result["runs"].items():
        for grouping, rows in (r.get("losses") or {}).items():
            if isinstance(rows, list):
                t["losses"] += [{"run": name, "grouping": grouping, **row} for row in rows]
        sp = r.get("spectra")
        if sp:
            t["spectra"] += [{"run": name, **row} for row in sp["per_matrix"]]
            t["spectra_by_type"] += [{"run": name, **row} for row in sp["per_type"]]
            t["crystallisation"] += [
                {"run": name, "type": c["type"], "milestone": c["milestone"], "tol": sp["tol"],
                 "distances": " ".join(f"{d:.4g}" for d in c["distances"]),
                 "rank_changes": " ".join(f"{d:.4g}" for d in c.get("rank_changes", []))}
                for c in sp["crystallisation"]
            ]  # fmt: skip
        att = r.get("attention")
        if att:
            t["attention_heads"] += [{"run": name, **row} for row in att["heads"]]
            t["attention_layers"] += [{"run": name, **row} for row in att["layers"]]
        t["stream"] += [{"run": name, **row} for row in r.get("stream") or []]
        t["gates"] += [{"run": name, **row} for row in r.get("gates") or []]
    for c in result["comparisons"]:
        for grouping, v in c.items():
            if isinstance(v, dict) and "rows" in v:
                t["deltas"] += [{"run": c["run"], "vs": c["vs"], "grouping": grouping, **row} for row in v["rows"]]
                t["delta_identity"].append({"run": c["run"], "vs": c["vs"], "grouping": grouping, **v["identity"]})
    return t


def write_outputs(result: dict, out_dir: Path) -> list[Path]:
    """Write analysis.json and every non-empty CSV table; the paths written. Each file is
    written whole or not at all (a temporary file renamed), analysis.json last: a kill at
    any instant never leaves a torn file, and a new analysis.json (what the report and
    `--analyze`'s "already analysed" read) only once its tables are written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in tables(result).items():
        p = _write_csv(out_dir / f"{name}.csv", rows)
        if p is not None:
            written.append(p)
    js = out_dir / "analysis.json"
    tmp = js.with_name(f".{js.name}.tmp")
    tmp.write_text(json.dumps(_clean(result), indent=1, allow_nan=False))
    os.replace(tmp, js)
    return [js, *written]


# --------------------------------------------------------------------------- printing


def _f(x: Any, fmt: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, fmt) if isinstance(x, float) else str(x)


def _interval(row: dict) -> str:
    lo, hi = row.get("delta_lo"), row.get("delta_hi")
    return "–" if lo is None or hi is None else f"[{lo:+.4f}, {hi:+.4f}]"


def _table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
    t = Table(title)
    for i, c in enumerate(columns):
        t.column(c, "left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[_f(x) if not isinstance(x, str) else x for x in r])
    return t


def print_tables(result: dict, out: Output) -> None:
    """Summary tables: losses by region and type, paired Δs with the identity check,
    spectra per type with crystallisation points, attention and stream per layer."""
    sample = result.get("sample")
    if sample:
        out.note(
            f"evaluation sample: {sample['rows']} rows × {sample['seq_len']} tokens = "
            f"{sample['tokens']} scored tokens from {sample['data_dir']} (checkpoint {result['checkpoint']})"
        )
    thin_noted = False
    for name, r in result["runs"].items():
        ls = r.get("losses")
        if ls:
            floor = "entropy_floor" in ls
            thin = [f"{g['group']} {g['tokens']}" for grouping in ("region", "exercise") for g in ls[grouping]
                    if g["tokens"] < MIN_GROUP_TOKENS]
            if thin and not thin_noted:
                thin_noted = True
                out.note(f"note: fewer than {MIN_GROUP_TOKENS} scored tokens in this sample for {', '.join(thin)}: "
                         "their loss and Δ rest on too few tokens to read (`--eval-rows auto` takes enough rows)")
            for grouping in ("region", "exercise"):
                title = f"{name}: loss by {grouping} (mean {ls['loss']:.4f} over {ls['tokens']} tokens"
                if floor:
                    title += f"; entropy floor {ls['entropy_floor']:.4f}, above it {ls['loss_above_floor']:.4f}"
                out.table(_table(
                    title + ")",
                    (grouping, "tokens", "token share", "loss", "loss share", *(("floor", "above floor") if floor else ())),
                    ((g["group"], g["tokens"], g["token_share"], g["loss"], g["loss_share"],
                      *((g["entropy_floor"], g["loss_above_floor"]) if floor else ())) for g in ls[grouping]),
                ))  # fmt: skip
        sp = r.get("spectra")
        if sp:
            milestones = sorted({row["milestone"] for row in sp["per_type"]})
            by = {(row["type"], row["milestone"]): row for row in sp["per_type"]}
            crystal = {c["type"]: c["milestone"] for c in sp["crystallisation"]}
            types = [c["type"] for c in sp["crystallisation"]]
            out.table(_table(
                f"{name}: mean stable rank per matrix type at each milestone; effective rank at the last; "
                f"settled = from this milestone on, each step changes the spectrum's shape by < {sp['tol']} "
                f"and its mean stable rank by < {sp['tol']:.0%}",
                ("type", *(f"{m:.0%}" for m in milestones), "eff. rank", "settled"),
                ((t, *(by[(t, m)]["stable_rank"] if (t, m) in by else None for m in milestones),
                  by[(t, milestones[-1])]["effective_rank"] if (t, milestones[-1]) in by else None,
                  f"{crystal[t]:.0%}" if crystal[t] is not None else "not yet") for t in types),
            ))  # fmt: skip
        att = r.get("attention")
        if att:
            norm = ", min–max normalised" if result.get("attention_normalized") else ""
            out.table(_table(
                f"{name}: attention per layer (mean over heads{norm})",
                ("layer", "entropy", "‖A‖_F", "sink", "local₀", "local₁", "local₂", "head div."),
                ((str(a["layer"]), *(a[k] for k in ("entropy", "concentration", "sink", "local_0", "local_1",
                                                     "local_2", "head_diversity"))) for a in att["layers"]),
            ))  # fmt: skip
        if r.get("stream"):
            gates = {f"blocks.{g['layer']}.resid_post": g for g in r.get("gates") or []}
            out.table(_table(
                f"{name}: residual stream (σ(g) / α per sublayer; rank = entropy effective rank, centred)",
                ("point", "gate attn", "gate ffn", "RMS", "max |x|", "rank"),
                ((row["hook"].replace("blocks.", "").replace(".resid_post", " out").replace(".resid_pre", " in"),
                  gates.get(row["hook"], {}).get("attn"), gates.get(row["hook"], {}).get("ffn"),
                  row["rms"], row["max_abs"], row["rep_rank"]) for row in r["stream"]),
            ))  # fmt: skip
    for c in result["comparisons"]:
        for grouping in ("region", "exercise", "position", "frequency"):
            v = c.get(grouping)
            if not v:
                continue
            ident = v["identity"]
            ci = any("delta_lo" in g for g in v["rows"])
            out.table(_table(
                f"Δ = {c['run']} − {c['vs']} by {grouping}: aggregate {ident['aggregate_delta']:+.4f}, "
                f"token-weighted sum {ident['weighted_sum']:+.4f} (rel. error {ident['rel_error']:.1e})"
                + ("; 95%: per-token bootstrap interval of Δ" if ci else ""),
                (grouping, "tokens", "token share", c["run"], c["vs"], "Δ", *(("95%",) if ci else ()), "share·Δ",
                 "of aggregate"),
                ((g["group"], g["tokens"], g["token_share"], g["loss_a"], g["loss_b"], g["delta"],
                  *((_interval(g),) if ci else ()), g["weighted"], g["contribution"]) for g in v["rows"]),
            ))  # fmt: skip
        if c.get("recorded_val_delta") is not None:
            out.note(f"recorded final val-loss Δ (meta.json): {c['recorded_val_delta']:+.4f}")


def milestone_analysis_dir(group_dir: Path, pct: int) -> Path:
    """Where a final pair group's analysis at milestone `pct` goes: below the group's final
    analysis, so the readers of `ANALYSIS/*/analysis.json` never take it for a final one."""
    return Path(group_dir) / MILESTONES_DIR / f"milestone-{pct:03d}"


def load_milestone_analyses(analysis_dir: Path, error: type[DataError] = DataError) -> dict[str, dict[int, dict]]:
    """Group -> percent -> that group's analysis at the milestone (`sanlab report --analyze
    --milestones`), with "_path" added; `error` (one line) names a file that is not an
    analysis of the milestone its dir names."""
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(Path(analysis_dir).glob(f"*/{MILESTONES_DIR}/milestone-*/analysis.json")):
        m = MILESTONE_NAME.match(path.parent.name)
        a = read_json(path, error)
        if m is None or not isinstance(a, dict) or a.get("checkpoint") != path.parent.name \
                or not isinstance(a.get("runs"), dict):
            raise error(f"{path}: not a `sanlab analyze --checkpoint {path.parent.name}` analysis")
        a["_path"] = str(path)
        out.setdefault(path.parents[2].name, {})[int(m.group(1))] = a
    return out
