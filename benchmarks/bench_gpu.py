"""Training throughput of the matched arms on one accelerator, per attention backend.

For each arm of a matching (default: the paper's base SAN and its iso-param,
iso-FLOP and iso-depth partners, SPEC Table 1) and each attention backend
(FlexAttention with a document block mask, SDPA with a dense mask), time full
training steps — forward, fused CE + z-loss, backward, clip, Muon + AdamW step —
on packed rows with several documents each, and print a table: tokens/s, peak
memory, model FLOP/s (SPEC §1.2 training FLOPs/token, full-square attention) as a
fraction of a bf16 matmul peak measured in the same run (MFU against that peak), each
arm's speed relative to the SAN beside the FLOP ratio, and their quotient, the excess
(1.00: the SAN is as fast as its FLOPs allow; `bench_arms.py` defines it). On CUDA the
model is `torch.compile`d (`--no-compile` to skip). The paper's anchor (8 GPUs) is SAN
2.0M and FFN 4.4M tokens/s: the FFN arm 2.2x the SAN's speed at a FLOP ratio of ~2.0.

    python benchmarks/bench_gpu.py                       # CUDA, paper base shapes, compiled
    python benchmarks/bench_gpu.py --backends flex       # FlexAttention only (what device_check.sh runs)
    python benchmarks/bench_gpu.py --device cpu --tiny   # a seconds-long smoke run
"""

from __future__ import annotations

import argparse
import time

from sanlab.cliargs import ArgumentParser, bounded, device_name, non_negative_int, positive_int, script_main


def excess_ratios(step_s: dict[str, float], flops: dict[str, float], ref: str) -> dict[str, float]:
    """`bench_arms.excess_ratios` (one definition, in the script beside this one)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_arms", Path(__file__).with_name("bench_arms.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.excess_ratios(step_s, flops, ref)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _matmul_peak(device, n: int, reps: int = 10) -> float:
    import torch

    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        x @ x
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        x @ x
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def _packed_segments(rows: int, seq_len: int, device, mean_doc: int):
    """Segment ids of rows packed with documents of random lengths (mean `mean_doc`)."""
    import torch

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(mean_doc // 4, 2 * mean_doc, (rows * seq_len // (mean_doc // 4) + 1,), generator=g)
    starts = torch.zeros(rows * seq_len, dtype=torch.long)
    starts[lengths.cumsum(0)[lengths.cumsum(0) < rows * seq_len]] = 1
    seg = starts.view(rows, seq_len).cumsum(1)
    return (seg - seg[:, :1]).to(device)


def time_arm(cfg, backend: str, a: argparse.Namespace, device) -> dict:
    import torch

    from sanlab.config import OptimConfig
    from sanlab.model.lm import LM
    from sanlab.train.optim import build_optimizers, clip_grad_norm

    torch.manual_seed(0)
    model = LM(cfg.model_copy(update={"attn_backend": backend})).to(device)
    optims = build_optimizers(model, OptimConfig(lr=0.02 if not cfg.ffn else 0.04))
    if a.compile:  # as train.compile does: the masks built before the compiled layers
        model.compile_layers()
    forward = model
    tokens = torch.randint(0, cfg.vocab_size, (a.rows, a.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seg = _packed_segments(a.rows, a.seq_len, device, a.mean_doc)
    mask = torch.ones_like(inputs, dtype=torch.bool)
    amp = torch.autocast(device.type, dtype=torch.bfloat16)

    def step() -> None:
        with amp:
            loss, _ = forward(inputs, seg, targets, mask, 1e-4)
        loss.backward()
        clip_grad_norm(optims.params(), 1.0)
        optims.step()
        optims.zero_grad()

    for _ in range(a.warmup):  # includes the compilation (the model's, FlexAttention's)
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    _sync(device)
    dt = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {"tokens_per_s": a.rows * a.seq_len / dt, "peak_gib": peak}


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from sanlab.accounting import count_flops, preset
    from sanlab.config import ModelConfig
    from sanlab.matching import match

    p = ArgumentParser(prog="bench_gpu.py", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", type=device_name, default=None,
                   help="default: cuda; skipped (exit 0) when there is none")
    p.add_argument("--preset", default="base", help="ladder rung of the reference SAN")
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument("--rows", type=positive_int, default=16, help="rows per step (one micro-batch)")
    p.add_argument("--mean-doc", type=bounded(int, lo=4), default=400,
                   help="mean document length in a packed row (documents are drawn from mean/4 to 2·mean tokens)")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--backends", default="flex,sdpa")
    p.add_argument("--tiny", action="store_true", help="small shapes for a smoke run")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on CUDA)")
    a = p.parse_args(argv)
    unknown = [b for b in a.backends.split(",") if b not in ("flex", "sdpa", "explicit")]
    if unknown:
        p.error(f"--backends: unknown backend {unknown[0]!r} (flex, sdpa or explicit)")
    if a.device is None and not torch.cuda.is_available():  # `make bench` on a CPU machine
        print("bench_gpu: skipped, no CUDA device (--device cpu --tiny runs a smoke test)")
        return 0
    device = torch.device(a.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; use --device cpu --tiny for a smoke run")
        return 2
    if a.compile is None:
        a.compile = device.type == "cuda"
    if a.tiny:
        ref = ModelConfig(d_model=64, n_layers=5, n_heads=4, n_kv_heads=2, vocab_size=512)
        a.seq_len, a.rows, a.steps, a.warmup, a.mean_doc = 128, 4, 2, 1, 40
    else:
        ref = preset(a.preset)
    arms = match(ref, a.seq_len, policy="at_most")
    peak = _matmul_peak(device, 256 if a.tiny else 8192)
    console = Console(width=200)
    table = Table(title=f"training step on {device.type} "
                        f"({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), bf16, "
                        f"{'compiled, ' if a.compile else ''}{a.rows}×{a.seq_len} tokens, packed documents "
                        f"(mean {a.mean_doc}); matmul peak {peak / 1e12:.0f} TFLOP/s")
    for col in ("arm", "config", "backend", "tokens/s", "vs SAN", "FLOP ratio (SAN/arm)", "excess", "peak GiB",
                "model TFLOP/s", "MFU (of peak)"):
        table.add_column(col, justify="left" if col in ("arm", "config", "backend") else "right")
    flops_tok = {arm.name: count_flops(arm.config, a.seq_len).train for arm in arms}
    san = arms[0].name  # the matching's reference: the SAN
    for backend in a.backends.split(","):
        results = {arm.name: time_arm(arm.config, backend, a, device) for arm in arms}
        step_s = {n: 1.0 / r["tokens_per_s"] for n, r in results.items()}  # same tokens a step in every arm
        excess = excess_ratios(step_s, flops_tok, san)
        for arm in arms:
            r, n = results[arm.name], arm.name
            achieved = flops_tok[n] * r["tokens_per_s"]
            ratio = "" if n == san else f"{flops_tok[san] / flops_tok[n]:.2f}"
            table.add_row(n, arm.label, backend, f"{r['tokens_per_s']:,.0f}",
                          f"{r['tokens_per_s'] / results[san]['tokens_per_s']:.2f}×", ratio,
                          "" if n == san else f"{excess[n]:.2f}×", f"{r['peak_gib']:.1f}",
                          f"{achieved / 1e12:.2f}", f"{achieved / peak:.1%}")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
