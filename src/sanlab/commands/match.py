"""`sanlab match`: the matched arms of a reference model, as a table like the paper's Table 1."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sanlab.accounting import PRESET_SEQ_LEN, PRESETS, preset
from sanlab.cliargs import non_negative_float, positive_int
from sanlab.config import Config, ModelConfig, apply_overrides, load_toml
from sanlab.errors import ConfigError
from sanlab.matching import POLICIES, TARGETS, Arm, match
from sanlab.tables import Output, Table, add_format_flag, refuse_json_and_format

_EPILOG = """\
The reference is a sanlab run config: a TOML file with [model] and [data] sections
(the same file `sanlab train` takes) and/or `section.key=value` overrides. Model keys
may be given without their section: `d_model=512` means `model.d_model=512`.
`--preset NAME` starts from a rung of the paper's ladder (vocab 16384, 8/4 heads,
seq_len 2048) instead of a file; overrides still apply on top.

The partner is the other kind (ffn flipped) with every other switch copied from the
reference; `--partner key=value` changes one of them (e.g. --partner residual=standard).

Counting (SPEC §1.2): non-embedding parameters; training FLOPs per token = 3 × forward,
forward = 2·weights + 4·T·d attention per layer (full square; --causal-half halves it)
+ the 2·V·d head. A variant (model.mixer, model.layout) counts what its mixer class
declares; --breakdown prints every term.

examples:
  sanlab match --preset base
  sanlab match --preset tiny --policy nearest --json
  sanlab match run.toml data.seq_len=1024 --tolerance 0.02
  sanlab match d_model=256 n_layers=12 vocab_size=4096 --width
  sanlab match --preset base mixer=non_approximate layout=hybrid --breakdown
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("items", nargs="*", metavar="[CONFIG.toml] [key=value]",
                        help="a run config file and/or overrides of the reference")
    parser.add_argument("--preset", choices=list(PRESETS), help="a rung of the paper's size ladder")
    parser.add_argument("--seq-len", type=positive_int, help="row length T for the attention FLOPs (default: data.seq_len)")
    parser.add_argument("--policy", choices=POLICIES, default="at_most",
                        help="partner not above (paper's Table 1), nearest to, or not below the reference")
    parser.add_argument("--tolerance", type=non_negative_float,
                        help="largest accepted |relative mismatch|, e.g. 0.02; beyond it is an error")
    parser.add_argument("--causal-half", action="store_true",
                        help="count causal attention as half the T×T square")
    parser.add_argument("--width", action="store_true",
                        help="search the partner's width at the reference depth instead of its depth")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="comma-separated partners to find: params, flops, depth (default: all)")
    parser.add_argument("--partner", action="append", default=[], metavar="key=value",
                        help="a model key of the partner that differs from the reference (repeatable)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print every FLOP term and every parameter term per arm")
    parser.add_argument("--json", action="store_true", help="print a JSON list of arms instead of tables")
    add_format_flag(parser)


def _qualify(item: str) -> str:
    """`d_model=512` -> `model.d_model=512`: plain keys are model keys."""
    key = item.split("=", 1)[0]
    return item if "." in key else f"model.{item}"


def _reference(args: argparse.Namespace) -> tuple[ModelConfig, int]:
    files = [i for i in args.items if "=" not in i]
    overrides = [_qualify(i) for i in args.items if "=" in i]
    if len(files) > 1:
        raise ConfigError(f"one config file at most, got {', '.join(files)}")
    if files and args.preset:
        raise ConfigError("give a config file or --preset, not both")
    data: dict[str, Any] = {}
    source = "config"
    if files:
        data, source = load_toml(files[0]), files[0]
    elif args.preset:
        data = {"model": preset(args.preset).model_dump(), "data": {"seq_len": PRESET_SEQ_LEN}}
        source = f"preset {args.preset}"
    cfg = apply_overrides(Config, data, overrides, source=source)
    seq_len = args.seq_len if args.seq_len is not None else cfg.data.seq_len
    if seq_len <= 0:
        raise ConfigError(f"--seq-len must be positive, got {seq_len}")
    return cfg.model, seq_len


def _partner_updates(reference: ModelConfig, items: list[str]) -> dict[str, Any]:
    """Typed partner fields from `key=value` strings (same parsing as any override)."""
    keys = [i.split("=", 1)[0].strip() for i in items]
    # the other kind (`ffn` flipped), unless the partner names its own state mixer
    flip = {} if {"ffn", "state_mixer"} & set(keys) else {"ffn": not reference.ffn}
    base = {**reference.model_dump(), **flip}
    parsed = apply_overrides(ModelConfig, base, items, source="partner")
    return {k: getattr(parsed, k) for k in keys}


# What each partner's mismatch is measured in, for the table.
_MATCHED = {"iso-param": "params", "iso-FLOP": "FLOPs", "iso-depth": "depth"}


def _fmt_m(n: int) -> str:
    return f"{n / 1e6:.2f}M"


_TERM_TITLES = {"attn_proj": "attn proj", "attn_scores": "attn q·kᵀ", "attn_mix": "attn A·v", "ffn": "FFN"}


def _print_tables(arms: list[Arm], seq_len: int, policy: str, causal_half: bool, breakdown: bool,
                  out: Output) -> None:
    attn = "causal half" if causal_half else "full square"
    table = Table(f"Matched arms (T={seq_len}, policy {policy}, attention FLOPs {attn})")
    for col, justify in (("arm", "left"), ("config", "left"), ("total params", "right"),
                         ("non-emb params", "right"), ("train GFLOPs / token", "right"), ("mismatch", "right")):
        table.column(col, justify)  # type: ignore[arg-type]
    for a in arms:
        mismatch = "—" if a.role == "reference" else f"{a.mismatch:+.2%} {_MATCHED[a.role]}"
        table.add_row(a.name, a.label, _fmt_m(a.params.total), _fmt_m(a.params.non_embedding),
                      f"{a.flops.train / 1e9:.3f}", mismatch)
    out.table(table)
    if not breakdown:
        return
    terms = Table("MFLOPs per token by term, all layers (training = 3 × forward; exact in --json)")
    terms.column("arm")
    names = list(dict.fromkeys(n for a in arms for n in a.flops.term_names()))
    for col in (*names, "forward", "train"):
        terms.column(_TERM_TITLES.get(col, col), "right")
    for a in arms:
        f = a.flops
        terms.add_row(a.name, *(f"{v / 1e6:.1f}" for v in (*(f.term(n) for n in names), f.forward, f.train)))
    out.table(terms)
    params = Table("Parameters by term, all layers (names as in the model, layer prefix removed)")
    params.column("arm")
    pnames = list(dict.fromkeys(n for a in arms for n in a.params.breakdown))
    for col in pnames:
        params.column(col, "right")
    for a in arms:
        params.add_row(a.name, *(f"{a.params.breakdown.get(n, 0):,}" for n in pnames))
    out.table(params)


def run(args: argparse.Namespace) -> int:
    refuse_json_and_format(args)
    reference, seq_len = _reference(args)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets:
        raise ConfigError(f"--targets {args.targets!r}: give at least one partner to find ({', '.join(TARGETS)})")
    twice = next((t for i, t in enumerate(targets) if t in targets[:i]), None)
    if twice is not None:
        raise ConfigError(f"--targets {args.targets!r}: {twice} given twice")
    arms = match(
        reference, seq_len,
        targets=targets,  # type: ignore[arg-type]  # validated by match()
        policy=args.policy,
        tolerance=args.tolerance,
        causal_half=args.causal_half,
        vary="width" if args.width else "depth",
        partner=_partner_updates(reference, args.partner),
    )
    if args.json:
        print(json.dumps([a.to_dict() for a in arms], indent=2))
    else:
        with Output(args.format) as out:
            _print_tables(arms, seq_len, args.policy, args.causal_half, args.breakdown, out)
    return 0
