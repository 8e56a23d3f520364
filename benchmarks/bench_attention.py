"""Attention forward + backward: sanlab's explicit CPU kernel against SDPA, by row length.

Both run `sanlab.model.layers.attend` on the same bf16 q, k, v (GQA, causal mask from one
document a row) under bf16 autocast, as a training step calls them; the explicit kernel
also at other query-block sizes. Each cell is the best of `--reps` timed repetitions
after warm-up; the error column is the largest output error of each kernel against an
fp64 reference (the worst relative error of the output and the q, k, v gradients), so
speed is never bought with accuracy.

    python benchmarks/bench_attention.py [--tokens 2048 --heads 8 --kv-heads 4 --head-dim 32]
"""

from __future__ import annotations

import argparse
import sys
import time


def _time(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    import sanlab.model.kernels as kernels
    import sanlab.model.layers as layers
    from sanlab.config import ModelConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048, help="tokens a batch (rows = tokens / T)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from sanlab.train.host import tune_cpu_allocator

    tune_cpu_allocator()  # as `sanlab train` runs on the CPU

    table = Table(title=f"attention fwd+bwd, H={a.heads}/{a.kv_heads} D={a.head_dim}, {a.tokens} tokens a batch, "
                        f"bf16 autocast, {a.threads} threads (ms)")
    table.add_column("T", justify="right")
    table.add_column("sdpa", justify="right")
    for c in a.chunks:
        table.add_column(f"explicit {c}-row blocks", justify="right")
    table.add_column("sdpa / explicit", justify="right")
    table.add_column("rel err sdpa", justify="right")
    table.add_column("rel err explicit", justify="right")
    default_chunk = kernels.EXPLICIT_CHUNK
    for T in a.seq_lens:
        B = max(1, a.tokens // T)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, a.heads, T, a.head_dim, generator=g).bfloat16().requires_grad_()
        k, v = (torch.randn(B, a.kv_heads, T, a.head_dim, generator=g).bfloat16().requires_grad_() for _ in range(2))
        grad = torch.randn(B, a.heads, T, a.head_dim, generator=g).bfloat16()
        tokens = torch.zeros(B, T, dtype=torch.long)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        exact_out = layers.attend(*leaves, layers.build_context(ModelConfig(attn_backend="sdpa"), tokens, None))
        exact_out.backward(grad.double())
        exact = [exact_out.detach(), *(t.grad for t in leaves)]

        def cell(backend: str, chunk: int) -> tuple[float, float]:
            kernels.EXPLICIT_CHUNK = chunk
            ctx = layers.build_context(ModelConfig(attn_backend=backend), tokens, None)

            def step() -> torch.Tensor:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = layers.attend(q, k, v, ctx)
                out.backward(grad)
                return out

            seconds = _time(step, a.reps)
            for t in (q, k, v):
                t.grad = None
            got = [step().detach(), q.grad, k.grad, v.grad]
            # the worst relative error (whole-tensor norm) of the output and the three gradients
            return seconds, max(float((g.double() - e).norm() / e.norm()) for g, e in zip(got, exact))

        try:
            sdpa, sdpa_err = cell("sdpa", default_chunk)
            row = [str(T), f"{sdpa * 1e3:.2f}"]
            explicit, errors = {}, []
            for c in a.chunks:
                explicit[c], err = cell("explicit", c)
                errors.append(err)
                row.append(f"{explicit[c] * 1e3:.2f}")
        finally:
            kernels.EXPLICIT_CHUNK = default_chunk
        best = explicit.get(default_chunk, min(explicit.values()))
        row += [f"{sdpa / best:.2f}x", f"{sdpa_err:.1e}", f"{max(errors):.1e}"]
        table.add_row(*row)
    Console(width=max(120, Console().width)).print(table)
    print(f"sdpa / explicit uses the default block of {default_chunk} query rows (EXPLICIT_CHUNK).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
