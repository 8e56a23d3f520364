"""Data throughput: `sanlab prepare` and the loader, against what training consumes.

Prepare rows time the whole pipeline (generate or read, train the BPE, tokenize, pack,
hash, rename). The loader must never be the bottleneck: it has to deliver batches at
least 50× faster than a default CPU model trains on them. The training need is measured
in the same run: full training steps (bf16 autocast where the CPU has bf16 natively,
else fp32, as `train.precision=auto`; fused loss, backward, Muon + AdamW) of the default
SAN and of the default-width standard arm with one layer — the fastest consumer of
tokens — on batches from the same loader.

    python benchmarks/bench_data.py [--tokens 1M --seq-len 256 --batch 16 --steps 2000]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sanlab.cliargs import ArgumentParser, positive_int, script_main
from sanlab.config import apply_overrides
from sanlab.data.loader import Loader
from sanlab.data.prepare import PrepareConfig, parse_count, prepare

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


def _training_rate(data_dir: Path, batch: int, steps: int, **model: object) -> float:
    """Tokens per second of full training steps of the default model with `model` overrides."""
    import torch

    from sanlab.config import Config
    from sanlab.model.lm import LM
    from sanlab.train.host import resolve_precision
    from sanlab.train.optim import build_optimizers, clip_grad_norm

    bf16 = resolve_precision("auto", "cpu") == "bf16"  # train.precision=auto, as the trainer resolves it
    torch.manual_seed(0)
    loader = Loader(data_dir, batch_rows=batch, seed=0)
    cfg = Config().model.model_copy(update={"vocab_size": loader.vocab_size, **model})
    lm = LM(cfg)
    optims = build_optimizers(lm, Config().optim)

    def step(i: int) -> None:
        b = loader.batch(i)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = lm(b["inputs"], b["segment_ids"], b["targets"], b["loss_mask"], 1e-4)
        loss.backward()
        clip_grad_norm(optims.params(), 1.0)
        optims.step()
        optims.zero_grad()

    for i in range(2):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps * batch * loader.seq_len / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="bench_data.py", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1M")
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--vocab", type=positive_int, default=2048)
    p.add_argument("--batch", type=positive_int, default=16, help="rows per rank per step")
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--train-steps", type=positive_int, default=8, help="timed training steps per model")
    p.add_argument("--skip-kjv", action="store_true", help="skip the built-in English corpus")
    a = p.parse_args(argv)
    console = Console(width=120)
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
        need = 0.0
        for name, model in (("SAN, default 4L d128", {}), ("standard, 1L d128", {"ffn": True, "n_layers": 1})):
            rate = _training_rate(synth, a.batch, a.train_steps, **model)
            need = max(need, rate)
            table.add_row(f"training: {name}", f"{a.train_steps * a.batch * a.seq_len:,}", "", f"{rate:,.0f}", "")
        ratios = []
        for ws in (1, 4):
            rate = _loader_rate(synth, a.batch, a.steps, ws)
            ratios.append(rate / need)
            table.add_row(f"loader {a.batch}×{a.seq_len}, rank 0/{ws}", f"{a.steps * a.batch * a.seq_len:,}",
                          "", f"{rate:,.0f}", f"{ratios[-1]:,.0f}×")  # fmt: skip
    console.print(table)
    ok = min(ratios) >= REQUIRED_RATIO
    console.print(f"loader / fastest training need: {min(ratios):,.0f}× (required ≥ {REQUIRED_RATIO:.0f}×): "
                  + ("[green]ok[/green]" if ok else "[red]too slow[/red]"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(script_main(main))
