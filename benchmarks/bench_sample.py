"""Sampling throughput: tokens/s at several context lengths, with and without the KV cache.

For each context length C, a prompt of C tokens is prefilled and `--new` tokens are
decoded greedily; the time per new token is measured after the prefill (best of
`--repeat`). With the cache a new token costs one token's pass plus attention over C
cached keys, so its cost stays near flat as C grows; without it every token is a full
forward pass over the whole context, so its cost grows with C.

    python benchmarks/bench_sample.py [--d-model 256 --layers 8 --ffn --contexts 32,128,512,1024 --new 32]
"""

from __future__ import annotations

import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from sanlab.cliargs import ArgumentParser, bounded, device_name, int_list, positive_int, script_main
from sanlab.config import ModelConfig, validate
from sanlab.errors import ConfigError
from sanlab.model.generate import Decoder
from sanlab.model.lm import LM


def per_token_seconds(model: LM, context: int, new: int, use_cache: bool, repeat: int, device: str) -> float:
    max_len = context + new
    best = float("inf")
    for r in range(repeat):
        prompt = torch.randint(8, model.cfg.vocab_size, (1, context), generator=torch.Generator().manual_seed(r))
        dec = Decoder(model, max_len=max_len, use_cache=use_cache)
        logits = dec.prefill(prompt.to(device))
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(new):
            logits = dec.append(logits.argmax(-1, keepdim=True))
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / new)
    return best


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="bench_sample.py", description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=8)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=4)
    p.add_argument("--vocab", type=bounded(int, lo=9), default=2048,
                   help="more than the 8 special tokens (prompts are drawn from the rest)")
    p.add_argument("--ffn", action="store_true", help="the standard arm (default: the SAN)")
    p.add_argument("--contexts", type=int_list(1), default=[32, 128, 512, 1024],
                   help="comma-separated context lengths (default 32,128,512,1024)")
    p.add_argument("--new", type=positive_int, default=32, help="tokens decoded per measurement")
    p.add_argument("--repeat", type=positive_int, default=3)
    p.add_argument("--device", type=device_name, default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device}: no CUDA device is available")

    cfg = validate(ModelConfig, dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                     n_kv_heads=args.kv_heads, vocab_size=args.vocab, ffn=args.ffn), source="flags")
    torch.manual_seed(0)
    model = LM(cfg).to(args.device).eval()
    contexts = args.contexts
    per_token_seconds(model, contexts[0], 4, True, 1, args.device)  # warm-up
    table = Table(title=f"greedy sampling, {'standard' if args.ffn else 'SAN'} {args.layers}L d{args.d_model}, "
                        f"{args.device}, batch 1, fp32 ({args.new} new tokens per measurement)")
    for col in ("context", "cached tok/s", "full-forward tok/s", "speed-up", "cached ms/token", "vs first"):
        table.add_column(col, justify="right")
    first = None
    for c in contexts:
        cached = per_token_seconds(model, c, args.new, True, args.repeat, args.device)
        full = per_token_seconds(model, c, args.new, False, args.repeat, args.device)
        first = first or cached
        row = (str(c), f"{1 / cached:,.0f}", f"{1 / full:,.0f}", f"{full / cached:.1f}x",
               f"{1e3 * cached:.2f}", f"{cached / first:.2f}x")
        table.add_row(*row)
        print("  ".join(row), file=sys.stderr, flush=True)  # progress on a slow machine
    Console().print(table)
    return 0


if __name__ == "__main__":
    with torch.inference_mode():
        raise SystemExit(script_main(main))
