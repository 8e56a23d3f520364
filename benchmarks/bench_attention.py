"""Attention forward + backward on the CPU: sanlab's kernels against SDPA, by row length.

Every kernel runs `sanlab.model.attention.attend` on the same bf16 q, k, v (GQA, one
document a row) under bf16 autocast, as a training step calls it: SDPA with the dense
mask, the explicit PyTorch kernel, and the fused compiled kernel with its portable fp32
products and (where the CPU has them) on AMX tiles. The kernels' calls alternate, round
after round, so a drift in the machine's speed hits them alike; each column is the
median, the ratio column SDPA's time over the fastest sanlab kernel's, round by round.
The error columns are each kernel's worst relative error (output and the q, k, v
gradients, whole-tensor norms) against an fp64 reference, so speed is never bought with
accuracy.

    python benchmarks/bench_attention.py [--tokens 2048 --heads 8 --kv-heads 4 --head-dim 32]
"""

from __future__ import annotations

import statistics
import sys
import time

from sanlab.cliargs import ArgumentParser, positive_int, script_main


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from sanlab.config import ModelConfig
    from sanlab.model import attention, native
    from sanlab.model.attention import fused

    p = ArgumentParser(prog="bench_attention.py", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=positive_int, default=2048, help="tokens a batch (rows = tokens / T)")
    p.add_argument("--seq-lens", type=positive_int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=4)
    p.add_argument("--head-dim", type=positive_int, default=32)
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    a = p.parse_args(argv)
    if a.heads % a.kv_heads:
        p.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads} (grouped-query attention)")
    torch.set_num_threads(a.threads)
    from sanlab.train.host import tune_cpu_allocator

    tune_cpu_allocator()  # as `sanlab train` runs on the CPU
    kinds = {"sdpa": ("sdpa", True), "explicit": ("explicit", True)}
    if native.available():
        kinds["fused fp32"] = ("fused", False)
        if native.library().sanlab_amx_available():
            kinds["fused amx"] = ("fused", True)
    else:
        print(f"fused kernel unavailable: {native.unavailable_reason()}")

    table = Table(title=f"attention fwd+bwd, H={a.heads}/{a.kv_heads} D={a.head_dim}, {a.tokens} tokens a batch, "
                        f"bf16 autocast, {a.threads} threads: ms (median of {a.rounds} alternating rounds)")
    table.add_column("T", justify="right")
    for name in kinds:
        table.add_column(name, justify="right")
    table.add_column("sdpa / fastest sanlab", justify="right")
    for name in kinds:
        table.add_column(f"rel err {name}", justify="right")
    for T in a.seq_lens:
        B = max(1, a.tokens // T)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, a.heads, T, a.head_dim, generator=g).bfloat16().requires_grad_()
        k, v = (torch.randn(B, a.kv_heads, T, a.head_dim, generator=g).bfloat16().requires_grad_() for _ in range(2))
        grad = torch.randn(B, a.heads, T, a.head_dim, generator=g).bfloat16()
        tokens = torch.zeros(B, T, dtype=torch.long)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        exact_out = attention.attend(*leaves, attention.build_context(ModelConfig(attn_backend="sdpa"), tokens, None))
        exact_out.backward(grad.double())
        exact = [exact_out.detach(), *(t.grad for t in leaves)]

        def step(backend: str, amx: bool) -> list[torch.Tensor]:
            ctx = attention.build_context(ModelConfig(attn_backend=backend), tokens, None)
            fused.FUSED_AMX = amx
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = attention.attend(q, k, v, ctx)
                out.backward(grad)
            finally:
                fused.FUSED_AMX = True
            return [out.detach()]

        times: dict[str, list[float]] = {name: [] for name in kinds}
        errors: dict[str, float] = {}
        for name, (backend, amx) in kinds.items():  # warm-up, and the error of each
            for t in (q, k, v):
                t.grad = None
            got = step(backend, amx) + [q.grad, k.grad, v.grad]
            errors[name] = max(float((x.double() - e).norm() / e.norm()) for x, e in zip(got, exact))
        order = list(kinds)
        for r in range(a.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                step(*kinds[name])
                times[name].append(time.perf_counter() - t0)
        ours = [n for n in kinds if n != "sdpa"]
        ratio = statistics.median(times["sdpa"][i] / min(times[n][i] for n in ours) for i in range(a.rounds))
        table.add_row(str(T), *(f"{statistics.median(times[n]) * 1e3:.2f}" for n in kinds), f"{ratio:.2f}x",
                      *(f"{errors[n]:.1e}" for n in kinds))
    Console(width=max(120, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
