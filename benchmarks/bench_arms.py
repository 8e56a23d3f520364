"""Training speed of the SAN against its matched standard partners, next to their FLOP ratio.

For each shape the matching solver (the same as `sanlab match`) builds the SAN's
iso-param, iso-FLOP and iso-depth partners; all four models train in one child process
with their steps alternating (A B C D, then D C B A, …), so a drift in the machine's
speed hits every arm alike. Per arm: tokens/s (median step), achieved FLOP/s from the
SPEC §1.2 training FLOPs/token, and against the SAN the measured speed ratio (partner
tokens/s ÷ SAN tokens/s) beside the FLOP ratio (SAN FLOPs/token ÷ partner FLOPs/token).
excess = speed ratio ÷ FLOP ratio: 1.00 means each arm runs as fast as its FLOPs allow
relative to the other; > 1 means the SAN loses time beyond its FLOPs. Beside it, the
excess round by round (each SAN step against its own round's partner step, so a drift
in the machine's speed between rounds cancels): its median and a 95% bootstrap interval,
which says whether a target such as 1.25x is met or only within the noise. With
--repeats the interval resamples the processes too: on a shared machine the excess
moves more from process to process than from round to round. Then a torch
profiler breakdown of the SAN's step by operator, and its matrix products by shape with
the FLOP/s each achieved, so the next bottleneck is visible.

The step is the trainer's: bf16 autocast (or fp32), the fused head + loss, backward,
global-norm clip, Muon for the hidden matrices and fused AdamW for the rest.

    python benchmarks/bench_arms.py                     # the first shape of GRID
    python benchmarks/bench_arms.py --grid              # every CPU shape of GRID
    python benchmarks/bench_arms.py --grid --device cuda --compile   # the base SAN at T 1024 … 4096 (GPU_GRID)
    python benchmarks/bench_arms.py --repeats 5         # five processes: the excess in each, and the median
    python benchmarks/bench_arms.py --d 512 --layers 20 --seq-len 2048 --batch 8 --device cuda
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

from _children import run_children

from sanlab.cliargs import ArgumentParser, non_negative_int, positive_int, script_main

# (SAN layers, d_model, heads, kv_heads, seq_len, batch rows, vocab): MEASUREMENTS.md's shapes
GRID = [(10, 128, 4, 2, 256, 16, 2048), (10, 256, 4, 2, 512, 8, 2048), (20, 512, 8, 4, 1024, 4, 2048),
        (10, 128, 4, 2, 2048, 2, 2048)]
# on CUDA: the paper's base SAN (20L d512, 8/4 heads, vocab 16,384) at T 1024 … 4096,
# 32,768 tokens a step
GPU_GRID = [(20, 512, 8, 4, 1024, 32, 16384), (20, 512, 8, 4, 2048, 16, 16384), (20, 512, 8, 4, 4096, 8, 16384)]
ARMS = ("san", "iso_param", "iso_flop", "iso_depth")


def grid(device: str) -> list[tuple[int, ...]]:
    """The shapes `--grid` runs: GRID on the CPU, GPU_GRID on CUDA."""
    return GPU_GRID if device == "cuda" else GRID


# the matrix products, by the positions of their two operands in the op's inputs
PRODUCTS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}


def product_flops(name: str, shapes: list[list[int]]) -> int:
    """FLOPs of one call of a matrix product from its input shapes: 2·m·k·n per matrix,
    times the batch for bmm / baddbmm."""
    i, j = PRODUCTS[name]
    a, b = shapes[i], shapes[j]
    if len(a) != len(b) or a[-1] != b[-2] or len(a) not in (2, 3):
        raise ValueError(f"{name}: operand shapes {a} and {b} do not multiply")
    batch = a[0] if len(a) == 3 else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


def product_rows(events: Any, limit: int = 12) -> list[tuple[str, str, int, float, float]]:
    """(op, operand shapes, calls, total ms, GFLOP/s) for the matrix products among a
    profiler's `key_averages(group_by_input_shape=True)`, slowest in total first."""
    rows = []
    for e in events:
        if e.key not in PRODUCTS or not e.input_shapes or e.self_cpu_time_total <= 0:
            continue
        i, j = PRODUCTS[e.key]
        flops = product_flops(e.key, e.input_shapes) * e.count
        rows.append((e.key.removeprefix("aten::"), f"{e.input_shapes[i]} @ {e.input_shapes[j]}", e.count,
                     e.self_cpu_time_total / 1e3, flops / (e.self_cpu_time_total * 1e-6) / 1e9))
    return sorted(rows, key=lambda r: -r[3])[:limit]


def excess_ratios(step_s: dict[str, float], flops: dict[str, float], ref: str = "san") -> dict[str, float]:
    """Per partner, its speed ratio over the SAN's (t_SAN / t_arm, from step times at
    the same tokens a step) divided by the FLOP ratio (F_SAN / F_arm, FLOPs a token);
    `ref` names the SAN."""
    return {n: (step_s[ref] / step_s[n]) / (flops[ref] / flops[n]) for n in step_s if n != ref}


MIN_ROUNDS = 5  # fewer rounds than this get no interval (a bootstrap of 1-4 values says nothing)


def paired_excess(times: dict[str, list[float]], flops: dict[str, float], ref: str = "san",
                  resamples: int = 2000, seed: int = 0,
                  groups: list[int] | None = None) -> dict[str, tuple[float, float, float]]:
    """Per partner, (median, low, high) of the excess measured round by round: round i's
    SAN step against the same round's partner step (the two ran seconds apart, so a
    drift in the machine's speed cancels), and a 95% percentile-bootstrap interval of
    that median over the rounds (seeded, so a rerun on the same times prints the same;
    NaN with fewer than MIN_ROUNDS rounds). `groups`: the rounds of each process, in
    order (their sum is the number of rounds). With more than one, the bootstrap first
    draws processes, then rounds within each drawn process, so a process-to-process
    spread (the machine's state when each started) widens the interval instead of
    hiding in the pooled rounds."""
    import random

    rng = random.Random(seed)
    out = {}
    fl = {n: flops[ref] / flops[n] for n in times if n != ref}
    sizes = groups or [len(times[ref])]  # one group: the plain bootstrap over the rounds
    if sum(sizes) != len(times[ref]):
        raise ValueError(f"groups {sizes} do not add up to the {len(times[ref])} rounds")
    bounds = [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(len(sizes))]
    for n in fl:
        if len(times[n]) != len(times[ref]):
            raise ValueError(f"{n} has {len(times[n])} timed steps, {ref} {len(times[ref])}: not paired")
        per_round = [(s / t) / fl[n] for s, t in zip(times[ref], times[n])]
        if len(per_round) < MIN_ROUNDS:
            out[n] = (statistics.median(per_round), math.nan, math.nan)
            continue
        by_group = [per_round[a:b] for a, b in bounds]

        def draw() -> list[float]:
            return [x for g in rng.choices(by_group, k=len(by_group)) for x in rng.choices(g, k=len(g))]

        boots = sorted(statistics.median(draw()) for _ in range(resamples))
        out[n] = (statistics.median(per_round), boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1])
    return out


def interval_label(median: float, lo: float, hi: float) -> str:
    """'1.31x [1.26, 1.35]', or the median alone when there were too few rounds."""
    if math.isnan(lo):
        return f"{median:.2f}x (< {MIN_ROUNDS} rounds: no interval)"
    return f"{median:.2f}x [{lo:.2f}, {hi:.2f}]"


def _configs(a: argparse.Namespace) -> dict[str, Any]:
    from sanlab.config import ModelConfig, validate
    from sanlab.matching import match

    ref = validate(ModelConfig, dict(d_model=a.d, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                                     vocab_size=a.vocab, ffn=False), source="flags")
    arms = match(ref, a.seq_len, targets=("params", "flops", "depth"), policy="nearest")
    return {name: arm for name, arm in zip(ARMS, arms)}


class _Arm:
    def __init__(self, cfg: Any, a: argparse.Namespace) -> None:
        import torch

        from sanlab.config import OptimConfig
        from sanlab.model.lm import LM
        from sanlab.train.optim import build_optimizers

        torch.manual_seed(0)
        self.device = torch.device(a.device)
        self.model = LM(cfg).to(self.device)
        self.opt = build_optimizers(self.model, OptimConfig())
        if a.compile:  # as train.compile does: the masks built before the compiled layers
            self.model.compile_layers()
        step_model = self.model
        g = torch.Generator().manual_seed(0)
        rows = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g).to(self.device)
        inputs, targets = rows[:, :-1], rows[:, 1:]
        seg = torch.zeros_like(inputs)
        mask = torch.ones_like(inputs, dtype=torch.bool)
        self.bf16 = a.precision == "bf16"
        self.forward = lambda: step_model(inputs, seg, targets, mask, 1e-4)[0]

    def step(self) -> float:
        import torch

        from sanlab.train.optim import clip_grad_norm

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.forward()
        loss.backward()
        clip_grad_norm(self.opt.params(), 1.0)
        self.opt.step()
        self.opt.zero_grad()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0


def _child(a: argparse.Namespace, queue: Any) -> None:
    import torch

    from sanlab.train.host import tune_cpu_allocator

    if a.device == "cpu":
        tune_cpu_allocator()  # as `sanlab train` runs on the CPU
    torch.set_num_threads(a.threads)
    arms = {name: _Arm(arm.config, a) for name, arm in _configs(a).items()}
    for _ in range(a.warmup):
        for m in arms.values():
            m.step()
    times: dict[str, list[float]] = {name: [] for name in arms}
    order = list(arms)
    for i in range(a.steps):
        for name in order if i % 2 == 0 else order[::-1]:
            times[name].append(arms[name].step())
    profile, products = "", []
    if a.profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
        with torch_profile(activities=acts, record_shapes=a.device == "cpu") as prof:
            for _ in range(3):
                arms["san"].step()
        key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
        profile = prof.key_averages().table(sort_by=key, row_limit=14)
        if a.device == "cpu":  # (CPU time is the product's time only on the CPU)
            products = product_rows(prof.key_averages(group_by_input_shape=True))
    queue.put({"times": times, "profile": profile, "products": products})


def _measure(a: argparse.Namespace) -> dict[str, Any]:
    return run_children("bench_arms", _child, [(a,)])[0]


def _shape_table(a: argparse.Namespace, console: Any) -> dict[str, tuple[float, float, float]]:
    """Print one shape's tables; return per partner the excess round by round (median,
    low, high of its 95% interval), over every process's rounds with --repeats."""
    from rich.table import Table

    from sanlab.matching import model_label

    arms = _configs(a)
    runs = [_measure(argparse.Namespace(**{**vars(a), "profile": a.profile and i == 0})) for i in range(a.repeats)]
    out = runs[0]
    tokens = a.batch * a.seq_len
    step = {n: statistics.median(ts) for n, ts in out["times"].items()}
    tps = {n: tokens / s for n, s in step.items()}
    flops = {n: arm.flops.train for n, arm in arms.items()}
    table = Table(title=f"SAN {a.layers}L d{a.d} H{a.heads}/{a.kv_heads} T{a.seq_len} B{a.batch} V{a.vocab} "
                        f"{a.precision} {a.device}, {a.threads} threads; median of {a.steps} alternating steps")
    for col in ("arm", "config", "tokens/s", "GFLOP/s", "speed ratio (arm/SAN)", "FLOP ratio (SAN/arm)",
                "excess", "per round: median [95% CI]"):
        table.add_column(col, justify="left" if col in ("arm", "config") else "right")
    excess = excess_ratios(step, flops)
    paired = paired_excess(out["times"], flops)
    for n in arms:
        achieved = tps[n] * flops[n]
        if n == "san":
            table.add_row(n, model_label(arms[n].config), f"{tps[n]:,.0f}", f"{achieved / 1e9:.1f}", "", "", "")
            continue
        speed, fl = tps[n] / tps["san"], flops["san"] / flops[n]
        table.add_row(n, model_label(arms[n].config), f"{tps[n]:,.0f}", f"{achieved / 1e9:.1f}",
                      f"{speed:.2f}", f"{fl:.2f}", f"{excess[n]:.2f}x",
                      interval_label(*paired[n]))
    console.print(table)
    if len(runs) > 1:
        per_run: dict[str, list[float]] = {n: [] for n in excess}
        for run in runs:  # each process's ratios from its own alternating steps
            for n, x in excess_ratios({n: statistics.median(ts) for n, ts in run["times"].items()}, flops).items():
                per_run[n].append(x)
        console.print(f"excess in each of {len(runs)} processes (the table is the first): " + "; ".join(
            f"{n} " + " ".join(f"{x:.2f}" for x in xs) + f" (median {statistics.median(xs):.2f}x)"
            for n, xs in per_run.items()), highlight=False)
        pooled = {n: [t for run in runs for t in run["times"][n]] for n in arms}  # rounds stay paired
        paired = paired_excess(pooled, flops, groups=[len(run["times"]["san"]) for run in runs])
        rounds = len(pooled["san"])
        console.print(f"per round over all {len(runs)} processes ({rounds} rounds): " + "; ".join(
            f"{n} {interval_label(*paired[n])}" for n in excess), highlight=False)
    if out["profile"]:
        console.print(f"SAN step by operator (torch profiler, 3 steps):\n{out['profile']}", highlight=False)
    if out["products"]:
        prod = Table(title="SAN step's matrix products by shape (same 3 steps)")
        for col in ("op", "operands", "calls", "ms", "GFLOP/s"):
            prod.add_column(col, justify="left" if col in ("op", "operands") else "right")
        for op, shapes, calls, ms, gflops in out["products"]:
            prod.add_row(op, shapes, str(calls), f"{ms:.1f}", f"{gflops:.0f}")
        console.print(prod)
    return paired


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console

    from sanlab.train.host import resolve_precision

    p = ArgumentParser(prog="bench_arms.py", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=positive_int, default=GRID[0][0], help="SAN layers")
    p.add_argument("--d", type=positive_int, default=GRID[0][1])
    p.add_argument("--heads", type=positive_int, default=GRID[0][2])
    p.add_argument("--kv-heads", type=positive_int, default=GRID[0][3])
    p.add_argument("--seq-len", type=positive_int, default=GRID[0][4])
    p.add_argument("--batch", type=positive_int, default=GRID[0][5])
    p.add_argument("--vocab", type=positive_int, default=GRID[0][6])
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 where the device has bf16 products natively, else fp32 (as training)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=positive_int, default=8, help="timed steps per arm")
    p.add_argument("--warmup", type=non_negative_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="child processes per shape; with more than one, each one's excess, and an interval over them all")
    p.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    p.add_argument("--compile", action="store_true", help="torch.compile every arm (train.compile=true)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the SAN's per-op breakdown")
    p.add_argument("--grid", action="store_true", help="every shape of GRID (GPU_GRID with --device cuda), one table each, then a summary")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_arms: --device cuda but no CUDA device; nothing measured", file=sys.stderr)
        return 0
    a.precision = resolve_precision(a.precision, a.device)
    console = Console(width=max(150, Console().width))
    if not a.grid:
        _configs(a)  # a shape sanlab cannot build or match: refused now, not in the timing process
        _shape_table(a, console)
        return 0
    summary = []
    for layers, d, heads, kv, seq_len, batch, vocab in grid(a.device):
        shape = argparse.Namespace(**{**vars(a), "layers": layers, "d": d, "heads": heads, "kv_heads": kv,
                                      "seq_len": seq_len, "batch": batch, "vocab": vocab})
        summary.append((f"SAN {layers}L d{d} T{seq_len} B{batch}", _shape_table(shape, console)))
    console.print("excess round by round (median [95% CI]) per shape: " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {interval_label(*v)}" for k, v in ex.items())
        for name, ex in summary), highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
