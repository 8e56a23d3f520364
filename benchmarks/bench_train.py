"""Training throughput of sanlab's standard arm against Hugging Face's LlamaForCausalLM.

Both models get the same shape (d, layers, heads with GQA, d_ff, vocab, seq_len, batch),
precision (bf16 autocast or fp32) and optimizer (torch's fused AdamW, β₂ 0.95, grad
clip 1.0), and the same step: forward, CE loss, backward, clip, optimizer step. Achieved FLOP/s uses the
SPEC §1.2 training FLOPs/token (the same formula for both: the shapes are equal)
against a bf16/fp32 matmul peak measured in this same run.

Speed: both models live in one child process and their steps alternate (ABBA), so a
change in the machine's speed (a shared VM drifts by ±10% over seconds) hits both alike;
each arm's tokens/s is the median of all its timed steps over `--rounds` processes.
`sanlab train` on the CPU keeps freed memory in the heap (sanlab/train/host.py); the
comparison is made with those allocator settings in both processes and with glibc's
defaults in both, and "as each runs" sets sanlab's tuned figure against Llama's default
one. Peak memory: each model alone in its own process (ru_maxrss growth).

    python benchmarks/bench_train.py [--d 256 --layers 4 --heads 8 --kv-heads 4 ...]
    python benchmarks/bench_train.py --grid     # several CPU shapes, one summary table
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from typing import Any

from _children import run_children

from sanlab.cliargs import ArgumentParser, non_negative_int, positive_int, script_main


def _peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _model_config(a: argparse.Namespace) -> Any:
    """sanlab's standard arm at the flags' shape (a shape it cannot build: one line, exit 2)."""
    from sanlab.config import ModelConfig, validate

    return validate(ModelConfig, dict(d_model=a.d, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                                      vocab_size=a.vocab, ffn=True, d_ff=a.d_ff), source="flags")


def _build(arm: str, a: argparse.Namespace) -> tuple[Any, Any]:
    """The model and a function (tokens, targets) -> loss for one arm."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if arm.startswith("sanlab"):
        from sanlab.model.lm import LM

        model = LM(_model_config(a))
        if arm.endswith("compile"):  # as train.compile=true does
            model.compile_layers()
        forward = model
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


class _Arm:
    """One model, its optimizer and a fixed batch; `step()` times one training step."""

    def __init__(self, arm: str, a: argparse.Namespace) -> None:
        import torch

        self.model, self.loss_fn = _build(arm, a)
        self.model.train()
        # torch's fused AdamW for both (the trainer's choice; ~6x faster than the default loop)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01,
                                     fused=True)
        g = torch.Generator().manual_seed(0)
        rows = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g)
        self.tokens, self.targets = rows[:, :-1], rows[:, 1:]
        self.bf16 = a.precision == "bf16"
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss_fn(self.tokens, self.targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def _child(arms: list[str], tuned: bool, a: argparse.Namespace, queue: Any) -> None:
    """Time `arms` in one process, alternating their steps; or, with one arm, also its peak memory."""
    import torch

    from sanlab.train.host import tune_cpu_allocator

    if tuned and not tune_cpu_allocator():
        raise SystemExit("glibc's mallopt is not available here")
    torch.set_num_threads(a.threads)
    base = _peak_rss_mib()
    models = {arm: _Arm(arm, a) for arm in arms}
    for _ in range(a.warmup):
        for m in models.values():
            m.step()
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for i in range(a.steps):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            times[arm].append(models[arm].step())
    queue.put({"times": times, "params": {arm: m.params for arm, m in models.items()},
               "peak_mib": _peak_rss_mib() - base})


def _run_child(arms: list[str], tuned: bool, a: argparse.Namespace) -> dict[str, Any]:
    return run_children("bench_train", _child, [(arms, tuned, a)])[0]


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

    from sanlab.train.host import resolve_precision

    p = ArgumentParser(prog="bench_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--d", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=4)
    p.add_argument("--d-ff", type=positive_int, default=None, help="default 4·d")
    p.add_argument("--vocab", type=positive_int, default=2048)
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 where the device has bf16 products natively, else fp32 (as training)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per model per process")
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--rounds", type=positive_int, default=2, help="processes per allocator setting")
    p.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    p.add_argument("--compile", action="store_true", help="add a torch.compile'd sanlab row (~25 s to compile)")
    p.add_argument("--grid", action="store_true",
                   help="compare over the CPU shapes of GRID (d, heads, seq_len, batch) in one table")
    a = p.parse_args(argv)
    a.precision = resolve_precision(a.precision, "cpu")
    if a.grid:
        return _grid(a)
    a.d_ff = a.d_ff or 4 * a.d
    _model_config(a)  # refused now, not in the first timing process
    r = _compare(a)
    tokens = a.batch * a.seq_len
    table = Table(title=(f"training step, d={a.d} L={a.layers} H={a.heads}/{a.kv_heads} d_ff={a.d_ff} "
                         f"V={a.vocab} T={a.seq_len} B={a.batch} {a.precision} AdamW, "
                         f"{a.threads} threads; matmul peak {r['peak'] / 1e9:.0f} GFLOP/s"))
    for col in ("model", "params", "tokens/s, sanlab's malloc", "tokens/s, glibc malloc", "peak MiB",
                "GFLOP/s", "of peak"):
        table.add_column(col, justify="right")
    for arm in r["arms"]:
        tps = {k: tokens / r["step_s"][k][arm] for k in ("tuned", "default")}
        achieved = tokens / r["step_s"]["tuned" if arm.startswith("sanlab") else "default"][arm] * r["flops"]
        table.add_row(arm, f"{r['params'][arm] / 1e6:.2f}M", f"{tps['tuned']:,.0f}", f"{tps['default']:,.0f}",
                      f"{r['peak_mib'][arm]:.0f}", f"{achieved / 1e9:.1f}", f"{achieved / r['peak']:.1%}")
    console = Console(width=max(110, Console().width))
    console.print(table)
    console.print("(GFLOP/s: sanlab with its allocator settings, llama with glibc's defaults, as each runs)")
    ratios = _ratios(r["step_s"], "sanlab")
    console.print(f"sanlab / llama tokens/s: {ratios['as_run']:.2f}x as each runs (target >= 1.3x); "
                  f"{ratios['tuned']:.2f}x with sanlab's allocator settings in both, "
                  f"{ratios['default']:.2f}x with glibc's defaults in both")
    if a.compile:
        console.print(f"sanlab+compile / llama tokens/s: {_ratios(r['step_s'], 'sanlab+compile')['as_run']:.2f}x "
                      "as each runs")
    return 0


def _ratios(step_s: dict[str, dict[str, float]], ours: str) -> dict[str, float]:
    return {"as_run": step_s["default"]["llama"] / step_s["tuned"][ours],
            "tuned": step_s["tuned"]["llama"] / step_s["tuned"][ours],
            "default": step_s["default"]["llama"] / step_s["default"][ours]}


# (d_model, heads, kv_heads, seq_len, batch rows): the default CPU model (d=128, 4/2 heads)
# and a wider one, at the two row lengths either side of the CPU attention-kernel switch.
GRID = [(128, 4, 2, 128, 32), (128, 4, 2, 256, 16), (256, 8, 4, 128, 16), (256, 8, 4, 256, 8)]


def _compare(a: argparse.Namespace, memory: bool = True) -> dict[str, Any]:
    """Median step seconds per allocator setting and arm (all timed steps of all rounds),
    params, peak memory per arm (each alone), the matmul peak and the SPEC §1.2 training
    FLOPs per token."""
    from sanlab.accounting import count_flops

    arms = ["sanlab", "llama"] + (["sanlab+compile"] if a.compile else [])
    times: dict[str, dict[str, list[float]]] = {k: {arm: [] for arm in arms} for k in ("tuned", "default")}
    params: dict[str, int] = {}
    for _ in range(a.rounds):
        for setting in times:
            out = _run_child(arms, setting == "tuned", a)
            params.update(out["params"])
            for arm in arms:
                times[setting][arm] += out["times"][arm]
    peak_mib = {}
    if memory:
        for arm in arms:
            single = argparse.Namespace(**{**vars(a), "steps": 2, "warmup": 1})
            peak_mib[arm] = _run_child([arm], arm.startswith("sanlab"), single)["peak_mib"]
    flops = count_flops(_model_config(a), a.seq_len).train
    step_s = {k: {arm: statistics.median(ts) for arm, ts in v.items()} for k, v in times.items()}
    return {"arms": arms, "step_s": step_s, "params": params, "peak_mib": peak_mib,
            "peak": _matmul_peak(a) if memory else float("nan"), "flops": flops}


def _grid(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"training tokens/s, sanlab standard arm vs Llama, L={a.layers} V={a.vocab} "
                        f"{a.precision} AdamW, {a.threads} threads")
    for col in ("d", "heads", "T", "B", "sanlab", "llama", "sanlab / llama as each runs",
                "both sanlab's malloc", "both glibc malloc"):
        table.add_column(col, justify="right")
    for d, heads, kv_heads, seq_len, batch in GRID:
        shape = argparse.Namespace(**{**vars(a), "d": d, "heads": heads, "kv_heads": kv_heads,
                                      "seq_len": seq_len, "batch": batch, "d_ff": 4 * d, "compile": False})
        r = _compare(shape, memory=False)
        ratios = _ratios(r["step_s"], "sanlab")
        table.add_row(str(d), f"{heads}/{kv_heads}", str(seq_len), str(batch),
                      f"{batch * seq_len / r['step_s']['tuned']['sanlab']:,.0f}",
                      f"{batch * seq_len / r['step_s']['default']['llama']:,.0f}",
                      f"{ratios['as_run']:.2f}x", f"{ratios['tuned']:.2f}x", f"{ratios['default']:.2f}x")
    Console(width=max(120, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
