"""`sanlab analyze RUN_DIR [RUN_DIR …] [--vs RUN_DIR] [--out DIR]`

Where a gap between runs comes from (SPEC §1.6, §3). For each run, on a fixed sample of
held-out rows (the first `--eval-rows` of the validation order, the same for every run):
per-token loss by region / exercise type / position / token frequency, attention metrics
per layer and head, residual-stream RMS, peak activation and representation rank per
layer, residual gates; and weight spectra over the run's milestone checkpoints. With
`--vs B`, each run's per-token losses are paired with B's on the same tokens: Δ = run − B
per group, with the check that the token-weighted group Δs sum to the aggregate Δ.
Where the data dir has an entropy floor (`sanlab.data.floor`), each run's loss by region
and exercise type also shows the floor on the same tokens and the loss above it.

Results go to `--out` (default `<first RUN_DIR>/analysis`): `analysis.json` with
everything, and one CSV per table (see `sanlab.analysis.output`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from sanlab.analysis.output import print_tables, write_outputs
from sanlab.cliargs import bounded, positive_int
from sanlab.errors import CheckpointError, ConfigError, DataError
from sanlab.paths import check_out_dir
from sanlab.tables import Output, add_format_flag

SECTIONS = ("losses", "attention", "stream", "spectra")


def _sections(text: str) -> set[str]:
    chosen = {s.strip() for s in text.split(",") if s.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section {sorted(unknown)[0]!r} (choose from {', '.join(SECTIONS)})")
    return chosen


def eval_rows_arg(text: str) -> int | str:
    """`--eval-rows`: a positive number of rows, or `auto`."""
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to analyse")
    parser.add_argument("--vs", type=Path, default=None, metavar="RUN_DIR",
                        help="baseline run: report paired Δ = run − baseline on the same tokens")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where to write results (default: <first RUN_DIR>/analysis)")
    parser.add_argument("--checkpoint", default="latest", metavar="NAME",
                        help="checkpoint to evaluate: latest, milestone-050 or 50 (default latest)")
    parser.add_argument("--eval-rows", type=eval_rows_arg, default=32, metavar="N|auto",
                        help="held-out rows in the evaluation sample (default 32); auto: the fewest rows "
                             "in which every region and exercise type has 200 scored tokens")
    parser.add_argument("--batch-rows", type=positive_int, default=None, metavar="N",
                        help="rows per forward pass (default 4 on CPU, 16 on CUDA)")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="prepared data dir to evaluate on (default: the first run's data.dir)")
    parser.add_argument("--skip", type=_sections, default=set(), metavar="SECTIONS",
                        help=f"comma-separated sections to skip ({', '.join(SECTIONS)})")
    parser.add_argument("--normalize", action="store_true",
                        help="min–max normalise attention metrics across each run's layers and heads")
    parser.add_argument("--crystal-tol", type=bounded(float, lo=0, lo_open=True, hi=1), default=None, metavar="TOL",
                        help="spectrum change (total variation) below which a matrix type counts as "
                             "crystallised (default 0.02)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add_format_flag(parser)


def _device(choice: str) -> str:
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device available")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def _names(paths: list[Path]) -> list[str]:
    """Short unique labels: the directory name, or the path where names collide."""
    names = [p.resolve().name for p in paths]
    return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths)]


def analyze(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `sanlab analyze` computes, as one JSON-ready dict."""
    # lazy: torch, numpy; `sanlab analyze --help` runs without them
    from sanlab.analysis import losses as L
    from sanlab.analysis.evaluate import MIN_GROUP_TOKENS, evaluate, load_sample, rows_for_groups
    from sanlab.analysis.rundir import RunDir, check_data_tokenizer, check_same_tokenizer, checkpoint_name
    from sanlab.analysis.spectra import DEFAULT_TOL, run_spectra
    from sanlab.analysis.stream import gate_values
    from sanlab.data.floor import FLOOR_FILE, load_floor
    from sanlab.data.floor import rates as floor_rates

    if args.eval_rows != "auto" and args.eval_rows <= 0:
        raise ConfigError(f"--eval-rows must be positive, got {args.eval_rows}")
    if args.batch_rows is not None and args.batch_rows <= 0:
        raise ConfigError(f"--batch-rows must be positive, got {args.batch_rows}")
    device = _device(args.device)
    batch_rows = args.batch_rows or (16 if device == "cuda" else 4)
    tol = DEFAULT_TOL if args.crystal_tol is None else args.crystal_tol
    if not 0 < tol <= 1:
        raise ConfigError(f"--crystal-tol must lie in (0, 1], got {tol}")
    ckpt = checkpoint_name(args.checkpoint)
    paths = list(args.runs) + ([args.vs] if args.vs is not None else [])
    resolved = [p.resolve() for p in paths]
    dup = next((p for i, p in enumerate(paths) if resolved[i] in resolved[:i]), None)
    if dup is not None:
        raise ConfigError(f"{dup} is given twice (as a run and/or as --vs)")
    labels = _names(paths)
    runs = [RunDir.open(p) for p in paths]
    sections = [s for s in SECTIONS if s not in args.skip]
    needs_sample = any(s in sections for s in ("losses", "attention", "stream"))

    # fail fast on every bad input before any long computation
    for run in runs:
        if needs_sample:
            run.checkpoint_file(ckpt)
        if "spectra" in sections and not run.milestones():
            have = ", ".join(run.checkpoints()) or "none"
            raise CheckpointError(
                f"{run.path}: no milestone checkpoints for spectra (available: {have}); use --skip spectra"
            )
    data_dirs = [_try_data_dir(r) for r in runs]
    if args.vs is not None:
        base, base_data = runs[-1], data_dirs[-1]
        for run, d in zip(runs[:-1], data_dirs[:-1]):
            check_same_tokenizer(run, d, base, base_data)

    result: dict[str, Any] = {
        "checkpoint": ckpt,
        "device": device,
        "sections": sections,
        "attention_normalized": bool(args.normalize),
        "runs": {},
        "comparisons": [],
    }
    sample = table = token_floor = None
    if needs_sample:
        data_dir = runs[0].data_dir(args.data)
        for run, own in zip(runs, data_dirs):
            check_data_tokenizer(run, own, data_dir)
        rows_rule = f"--eval-rows {args.eval_rows}"
        n_rows = args.eval_rows
        if n_rows == "auto":
            n_rows, short = rows_for_groups(data_dir)
            rows_rule = (f"auto: the fewest validation rows with {MIN_GROUP_TOKENS} scored tokens in every region "
                         "and exercise type" + (f" (not reached in {n_rows} rows: "
                                               + ", ".join(f"{k} {v}" for k, v in short.items()) + ")" if short else ""))
        sample = load_sample(data_dir, n_rows)
        table = sample.token_table()
        result["sample"] = {
            "data_dir": str(data_dir),
            "rows_rule": rows_rule,
            "rows": sample.rows,
            "seq_len": int(sample.inputs.shape[1]),
            "tokens": len(table),
            "exercises": list(sample.exercise_names),
        }
        floor = load_floor(data_dir)
        if floor is not None:
            import torch

            rates = torch.from_numpy(floor_rates(floor, "val", sample.exercise_names))
            token_floor = L.token_entropy_floor(rates, table)
            result["sample"]["entropy_floor_file"] = str(data_dir / FLOOR_FILE)
        vocab = int(sample.inputs.max()) + 1
        for run, path in zip(runs, paths):
            if run.config.model.vocab_size < vocab:
                raise DataError(
                    f"{path}: model vocab {run.config.model.vocab_size} is smaller than the data's "
                    f"token ids (up to {vocab - 1}); pass the run's own --data"
                )

    losses: dict[str, Any] = {}
    for label, run in zip(labels, runs):
        t0 = time.perf_counter()
        out: dict[str, Any] = {"path": str(run.path), "config": run.config.model.model_dump()}
        if needs_sample:
            assert sample is not None and table is not None
            model = run.load_model(ckpt, device)
            res = evaluate(
                model,
                sample,
                batch_rows=batch_rows,
                device=device,
                attention="attention" in sections,
                stream="stream" in sections,
                normalize_attention=args.normalize,
            )
            losses[label] = res.losses
            if "losses" in sections:
                out["losses"] = L.decompose(res.losses, table, sample.token_counts)
                if token_floor is not None:
                    L.add_entropy_floor(out["losses"], token_floor, table)
            if res.attention is not None:
                out["attention"] = res.attention
            if res.stream is not None:
                out["stream"] = res.stream
                out["gates"] = gate_values(model.state_dict(), run.config.model)
            del model
        if "spectra" in sections:
            sp = run_spectra(run, tol, device)
            out["spectra"] = {
                "per_matrix": sp.per_matrix,
                "per_type": sp.per_type,
                "crystallisation": sp.crystallisation,
                "tol": sp.tol,
            }
        out["seconds"] = time.perf_counter() - t0
        final = run.meta.get("final")
        recorded = final.get("val_loss") if isinstance(final, dict) else None
        out["recorded_val_loss"] = recorded if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) \
            else None  # meta.json is a record, not an input: a value of the wrong type is none
        result["runs"][label] = out

    if args.vs is not None and "losses" in sections:
        assert table is not None and sample is not None
        base_label = labels[-1]
        for label in labels[:-1]:
            cmp = L.compare(losses[label], losses[base_label], table, sample.token_counts)
            ra, rb = result["runs"][label]["recorded_val_loss"], result["runs"][base_label]["recorded_val_loss"]
            cmp["recorded_val_delta"] = ra - rb if ra is not None and rb is not None else None
            result["comparisons"].append({"run": label, "vs": base_label, **cmp})
    return result


def _try_data_dir(run: Any) -> Path | None:
    """The run's own data dir if it can be found (for the tokenizer check), else None."""
    try:
        return run.data_dir()
    except DataError:
        return None


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.out is not None:  # before any work (the default, inside the first run dir, after its checks)
        check_out_dir(args.out)
    result = analyze(args)
    result["seconds"] = time.perf_counter() - t0
    out_dir = check_out_dir(args.out if args.out is not None else args.runs[0] / "analysis")
    files = write_outputs(result, out_dir)
    with Output(args.format) as out:
        print_tables(result, out)
        out.note(f"analysis took {result['seconds']:.1f} s; wrote {len(files)} files to {out_dir}")
    return 0
