"""Training throughput of sanlab's standard arm against Hugging Face's LlamaForCausalLM.

Both models get the same shape (d, layers, heads with GQA, d_ff, vocab, seq_len, batch),
precision (bf16 autocast or fp32) and optimizer (AdamW, β₂ 0.95, grad clip 1.0), and the
same step: forward, CE loss, backward, clip, optimizer step. Each arm runs in its own
child process so its peak memory is its own; arms alternate over rounds and the best
round counts (the machine is shared; the best round is the least disturbed one).
Achieved FLOP/s uses the SPEC §1.2 training FLOPs/token (the same formula for both:
the shapes are equal) against a bf16/fp32 matmul peak measured in this same run.

`sanlab train` on the CPU keeps freed memory in the heap (sanlab/train/host.py), so the
sanlab arm does too; `llama` is Hugging Face as it runs by default. Two more rows keep
the comparison of the model code alone honest: `sanlab-default-malloc` (glibc's
defaults) and `llama+malloc` (sanlab's allocator settings), and the summary prints the
ratio at equal allocator settings both ways.

    python benchmarks/bench_train.py [--d 256 --layers 4 --heads 8 --kv-heads 4 ...]
    python benchmarks/bench_train.py --grid     # several CPU shapes, one summary table
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from typing import Any


def _peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _build(arm: str, a: argparse.Namespace) -> tuple[Any, Any]:
    """The model and a function (tokens, targets) -> loss for one arm."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if arm.startswith("sanlab"):
        from sanlab.config import ModelConfig
        from sanlab.model.lm import LM

        model = LM(ModelConfig(d_model=a.d, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                               vocab_size=a.vocab, ffn=True, d_ff=a.d_ff))
        forward = torch.compile(model) if arm.endswith("compile") else model  # train.compile=true
        mask = torch.ones(a.batch, a.seq_len, dtype=torch.bool)

        def loss_fn(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return forward(tokens, None, targets, mask, 1e-4)[0]  # the trainer's fused head + loss
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(
            hidden_size=a.d, intermediate_size=a.d_ff, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
            max_position_embeddings=a.seq_len, tie_word_embeddings=True, attention_bias=False,
            mlp_bias=False, attn_implementation="sdpa", use_cache=False,
        ))

        def loss_fn(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            logits = model(input_ids=tokens).logits
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    return model, loss_fn


def _child(arm: str, a: argparse.Namespace, queue: Any) -> None:
    import torch

    from sanlab.train.host import tune_cpu_allocator

    if arm in ("sanlab", "sanlab+compile", "llama+malloc"):
        assert tune_cpu_allocator(), "glibc's mallopt is not available here"
    torch.set_num_threads(a.threads)
    base = _peak_rss_mib()
    model, loss_fn = _build(arm, a)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g)
    tokens, targets = rows[:, :-1], rows[:, 1:]
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = loss_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    queue.put({"step_s": statistics.median(times), "peak_mib": _peak_rss_mib() - base, "params": params,
               "loss": float(loss.detach())})


def _run_arm(arm: str, a: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(arm, a, queue))
    p.start()
    out = queue.get()
    p.join()
    return out


def _matmul_peak(a: argparse.Namespace, n: int = 1024, reps: int = 20) -> float:
    """FLOP/s of a large square matmul in the benchmark's precision (the attainable peak)."""
    import torch

    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    x, y = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        x @ y
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            x @ y
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=None, help="default 4·d")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--compile", action="store_true", help="add a torch.compile'd sanlab row (~25 s to compile)")
    p.add_argument("--grid", action="store_true",
                   help="compare over the CPU shapes of GRID (d, heads, seq_len, batch) in one table")
    a = p.parse_args(argv)
    if a.grid:
        return _grid(a)
    a.d_ff = a.d_ff or 4 * a.d
    best, peak, flops_per_token = _compare(a)
    tokens = a.batch * a.seq_len
    table = Table(title=(f"training step, d={a.d} L={a.layers} H={a.heads}/{a.kv_heads} d_ff={a.d_ff} "
                         f"V={a.vocab} T={a.seq_len} B={a.batch} {a.precision} AdamW, "
                         f"{a.threads} threads; matmul peak {peak / 1e9:.0f} GFLOP/s"))
    for col in ("model", "params", "tokens/s", "peak MiB", "GFLOP/s", "of peak"):
        table.add_column(col, justify="right")
    for arm, r in best.items():
        tps = tokens / r["step_s"]
        achieved = tps * flops_per_token
        table.add_row(arm, f"{r['params'] / 1e6:.2f}M", f"{tps:,.0f}", f"{r['peak_mib']:.0f}",
                      f"{achieved / 1e9:.1f}", f"{achieved / peak:.1%}")
    console = Console(width=max(100, Console().width))
    console.print(table)
    def ratio(ours: str, theirs: str) -> float:
        return best[theirs]["step_s"] / best[ours]["step_s"]

    console.print(f"sanlab / llama tokens/s, each as it runs: {ratio('sanlab', 'llama'):.2f}x (target >= 1.2x)")
    console.print(f"  same allocator settings: {ratio('sanlab', 'llama+malloc'):.2f}x with sanlab's, "
                  f"{ratio('sanlab-default-malloc', 'llama'):.2f}x with glibc's defaults")
    if "sanlab+compile" in best:
        console.print(f"sanlab+compile / llama tokens/s: {ratio('sanlab+compile', 'llama'):.2f}x")
    return 0


# (d_model, heads, kv_heads, seq_len, batch rows): the default CPU model (d=128, 4/2 heads)
# and a wider one, at the two row lengths either side of the CPU attention-kernel switch.
GRID = [(128, 4, 2, 128, 32), (128, 4, 2, 256, 16), (256, 8, 4, 128, 16), (256, 8, 4, 256, 8)]


def _compare(a: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], float, int]:
    """Best round per arm, the matmul peak, and the SPEC §1.2 training FLOPs per token."""
    from sanlab.accounting import count_flops
    from sanlab.config import ModelConfig

    arms = ["sanlab", "sanlab-default-malloc", "llama", "llama+malloc"] + (["sanlab+compile"] if a.compile else [])
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for _ in range(a.rounds):
        for arm in results:
            results[arm].append(_run_arm(arm, a))
    flops_per_token = count_flops(ModelConfig(d_model=a.d, n_layers=a.layers, n_heads=a.heads,
                                              n_kv_heads=a.kv_heads, vocab_size=a.vocab, ffn=True,
                                              d_ff=a.d_ff), a.seq_len).train
    return {arm: min(rs, key=lambda r: r["step_s"]) for arm, rs in results.items()}, _matmul_peak(a), flops_per_token


def _grid(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"training tokens/s, sanlab standard arm vs Llama, L={a.layers} V={a.vocab} "
                        f"{a.precision} AdamW, {a.threads} threads")
    for col in ("d", "heads", "T", "B", "sanlab", "llama", "sanlab / llama", "same malloc: / llama+malloc",
                "/ llama, glibc defaults"):
        table.add_column(col, justify="right")
    for d, heads, kv_heads, seq_len, batch in GRID:
        shape = argparse.Namespace(**{**vars(a), "d": d, "heads": heads, "kv_heads": kv_heads,
                                      "seq_len": seq_len, "batch": batch, "d_ff": 4 * d, "compile": False})
        best, _, _ = _compare(shape)
        tps = {arm: batch * seq_len / r["step_s"] for arm, r in best.items()}
        table.add_row(str(d), f"{heads}/{kv_heads}", str(seq_len), str(batch), f"{tps['sanlab']:,.0f}",
                      f"{tps['llama']:,.0f}", f"{tps['sanlab'] / tps['llama']:.2f}x",
                      f"{tps['sanlab'] / tps['llama+malloc']:.2f}x",
                      f"{tps['sanlab-default-malloc'] / tps['llama']:.2f}x")
    Console(width=max(120, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
