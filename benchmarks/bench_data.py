"""Data throughput: `sanlab prepare` and the loader, against what training consumes.

Prepare rows time the whole pipeline (generate or read, train the BPE, tokenize, pack,
hash, rename). The loader must never be the bottleneck: it has to deliver batches at least 50× faster
than a default CPU model trains on them. The reference consumption is the measured
training rate DESIGN.md records for a 10-layer attention-only model on this machine's
CPU (bf16 autocast, T=256, batch 16, vocab 2,048, d=128): ~9,000 tokens/s. The model is
not imported here, so this benchmark measures the data side alone.

    python benchmarks/bench_data.py [--tokens 1M --seq-len 256 --batch 16 --steps 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sanlab.config import apply_overrides
from sanlab.data.loader import Loader
from sanlab.data.prepare import PrepareConfig, parse_count, prepare

TRAIN_REFERENCE_TOK_S = 9_000.0  # DESIGN.md: 10-layer SAN, d=128, bf16, T=256, B=16, 2 CPU cores
REQUIRED_RATIO = 50.0


def _prepare(overrides: list[str], out: Path) -> tuple[float, int]:
    """Wall seconds and tokens written (both splits) for one prepare."""
    cfg = apply_overrides(PrepareConfig, {}, overrides)
    t0 = time.perf_counter()
    manifest = prepare(cfg, out)
    seconds = time.perf_counter() - t0
    return seconds, sum(s["tokens"] for s in manifest["splits"].values())


def _loader_rate(data_dir: Path, batch: int, steps: int, world_size: int) -> float:
    """Input tokens per second delivered to one rank (best of three passes)."""
    loader = Loader(data_dir, batch_rows=batch * world_size, seed=0, world_size=world_size)
    loader.batch(0)  # first touch of the memory maps and the epoch permutation
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for step in range(steps):
            loader.batch(step)
        best = min(best, time.perf_counter() - t0)
    return steps * batch * loader.seq_len / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1M")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="rows per rank per step")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--skip-kjv", action="store_true", help="skip the built-in English corpus")
    a = p.parse_args()
    console = Console()
    base = [f"seq_len={a.seq_len}", f"vocab_size={a.vocab}"]

    table = Table(title="sanlab data throughput", title_justify="left")
    for col in ("stage", "tokens", "seconds", "tokens/s", "× training need"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        synth = Path(tmp) / "synth"
        secs, n = _prepare([*base, f"tokens={parse_count(a.tokens)}"], synth)
        table.add_row("prepare synth", f"{n:,}", f"{secs:.2f}", f"{n / secs:,.0f}", "")
        if not a.skip_kjv:
            secs, n = _prepare([*base, "corpus=kjv"], Path(tmp) / "kjv")
            table.add_row("prepare kjv", f"{n:,}", f"{secs:.2f}", f"{n / secs:,.0f}", "")
        ratios = []
        for ws in (1, 4):
            rate = _loader_rate(synth, a.batch, a.steps, ws)
            ratios.append(rate / TRAIN_REFERENCE_TOK_S)
            table.add_row(f"loader {a.batch}×{a.seq_len}, rank 0/{ws}", f"{a.steps * a.batch * a.seq_len:,}",
                          "", f"{rate:,.0f}", f"{ratios[-1]:,.0f}×")  # fmt: skip
    table.add_row("training (reference)", "", "", f"{TRAIN_REFERENCE_TOK_S:,.0f}", "1×")
    console.print(table)
    ok = min(ratios) >= REQUIRED_RATIO
    console.print(f"loader / training need: {min(ratios):,.0f}× (required ≥ {REQUIRED_RATIO:.0f}×): "
                  + ("[green]ok[/green]" if ok else "[red]too slow[/red]"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
