"""`sanlab signal [CONFIG.toml] [key=value …] [--depths 2,4,8,16,32,48]`

Residual-stream growth with depth at initialisation (SPEC §1.1 Theorem 1): for the
configured architecture at each depth, E‖x_L‖² / E‖x_0‖² on random tokens. Run it
before training a deep model: a ratio that climbs with depth (e.g. `model.scale_out_init=false`
or `model.residual=standard`) warns of an unstable start; a bounded one is what the SAN's
gated, scaled-init residual promises.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sanlab.cliargs import non_negative_int, positive_int
from sanlab.config import load_config
from sanlab.errors import ConfigError
from sanlab.paths import check_out_file
from sanlab.tables import Output, Table, add_format_flag


def _depths(text: str) -> list[int]:
    try:
        depths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not depths or any(d <= 0 for d in depths):
        raise argparse.ArgumentTypeError(f"depths must be positive integers, got {text!r}")
    return depths


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "args", nargs="*", metavar="[CONFIG.toml] key=value",
        help="an optional run config and `section.key=value` overrides (model.* is what matters)",
    )
    parser.add_argument("--depths", type=_depths, default=[2, 4, 8, 16, 32, 48],
                        help="comma-separated numbers of blocks (default 2,4,8,16,32,48)")
    parser.add_argument("--rows", type=positive_int, default=8, help="random rows per depth (default 8)")
    parser.add_argument("--seq-len", type=positive_int, default=64, help="tokens per row (default 64)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows as JSON")
    add_format_flag(parser)


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `sanlab signal --help` runs without it
    import torch

    from sanlab.analysis.stream import signal_propagation

    path = next((a for a in args.args if "=" not in a), None)
    overrides = [a for a in args.args if "=" in a]
    extra = [a for a in args.args if "=" not in a and a != path]
    if extra:
        raise ConfigError(f"expected one config file and key=value overrides, got also {extra[0]!r}")
    if args.rows <= 0 or args.seq_len <= 0:
        raise ConfigError("--rows and --seq-len must be positive")
    if args.json is not None:
        check_out_file(args.json, "--json")
    cfg = load_config(path, overrides).model
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device available")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device

    rows = signal_propagation(cfg, args.depths, args.rows, args.seq_len, args.seed, device)

    table = Table(f"Residual stream at init: d={cfg.d_model}, ffn={cfg.ffn}, residual={cfg.residual}, "
                  f"norm={cfg.norm}, scale_out_init={cfg.scale_out_init}")
    for col in ("depth", "E‖x₀‖²", "E‖x_L‖²", "E‖x_L‖²/E‖x₀‖²", "max over layers"):
        table.column(col, "right")
    for r in rows:
        table.add_row(str(r["depth"]), f"{r['e0']:.4g}", f"{r['eL']:.4g}", f"{r['ratio']:.4f}", f"{r['max_ratio']:.4f}")
    out = Output(args.format)
    out.table(table)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        out.note(f"ratio ×{last['ratio'] / first['ratio']:.2f} from depth {first['depth']} to {last['depth']} "
                 "(Theorem 1: bounded for gated residuals with W_o std s/√(2L))")
    out.close()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": cfg.model_dump(), "rows": rows}, indent=1))
    return 0
