"""The feed-forward's SiLU(gate) ⊙ up: the compiled kernel (`csrc/swiglu.c`) against torch's formulas.

    .venv/bin/python benchmarks/bench_swiglu.py [--shapes demo,probe,facts] [--members 3] [--rounds 10]

Two measurements, each alternating the two implementations step by step in one process
(one thread, bf16 autocast as training runs on the CPU):

- `layer`: SiLU ⊙ up alone, forward + backward, on the standard arms' (M, B, T, 2F)
  gate|up product of the shape (M members folded, as the members engine hands it over):
  `_NativeSiLUGate` against `_SiLUGate` (torch's silu, mul and silu_backward on strided
  views of the product);
- `step`: a whole member-step (forward, backward, clip, Muon/AdamW) of each standard arm of
  the shape (`bench_members.Members`), the model's `silu_gate` switched between the two.

It prints ms per call (min–max over rounds, and the median), the ratio of the medians, and
whether the two give the same bits: outputs and gradients of the layer, and the weights of
the step's models after the timed steps (they start equal and train on the same rows). The
kernel gives torch's bits where torch's exp is SLEEF's (x86 with AVX2 or AVX-512): there a
difference exits 1.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_members as bm  # noqa: E402 - the shapes and the member stepper


def _times(fns: dict[str, Callable[[], Any]], rounds: int, reps: int) -> dict[str, list[float]]:
    """ms per call of each function, `reps` calls a round, the order reversed every round."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            for _ in range(reps):
                fns[k]()
            out[k].append((time.perf_counter() - t) / reps * 1e3)
    return out


def layer(shape: str, M: int, rounds: int) -> tuple[dict[str, list[float]], bool]:
    import torch

    from sanlab.model import kernels

    s, cfg = bm.SHAPES[shape], bm.arm_configs(shape)
    F = next(c for c in cfg.values() if c.ffn).ffn_dim
    g = torch.Generator().manual_seed(0)
    gu = (2 * torch.randn(M, s["batch"], s["seq_len"], 2 * F, generator=g)).bfloat16()
    dy = torch.randn(M, s["batch"], s["seq_len"], F, generator=g).bfloat16()
    impls = {"torch": kernels._SiLUGate.apply, "compiled": kernels._NativeSiLUGate.apply}
    got = {}
    for k, fn in impls.items():
        leaf = gu.clone().requires_grad_()
        y = fn(leaf)
        y.backward(dy)
        got[k] = (y.detach(), leaf.grad)
    same = all(torch.equal(a, b) for a, b in zip(got["torch"], got["compiled"]))

    def call(fn: Callable) -> Callable[[], Any]:
        leaf = gu.clone().requires_grad_()
        return lambda: torch.autograd.grad(fn(leaf), leaf, dy)

    return _times({k: call(fn) for k, fn in impls.items()}, rounds, 5), same


def step(shape: str, arm: str, M: int, rounds: int) -> tuple[dict[str, list[float]], bool]:
    import torch

    from sanlab.model import kernels, members

    cfg = bm.arm_configs(shape)[arm]
    base = bm.Members(cfg, shape, M, True)
    steppers = {"torch": base, "compiled": copy.deepcopy(base)}
    impls = {"torch": kernels._SiLUGate.apply, "compiled": kernels.silu_gate}

    def call(k: str) -> Callable[[], None]:
        def run() -> None:
            members.silu_gate = impls[k]
            steppers[k].step()
        return run

    fns = {k: call(k) for k in steppers}
    model_silu_gate = members.silu_gate
    try:
        for fn in fns.values():  # warm-up
            fn()
        times = _times(fns, rounds, 2)
    finally:
        members.silu_gate = model_silu_gate
    a, b = (dict(s.model.named_parameters()) for s in steppers.values())
    return times, all(torch.equal(a[n], b[n]) for n in a)


def _row(name: str, times: dict[str, list[float]], same: bool) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    cells = [f"{min(v):.2f}–{max(v):.2f} ({med[k]:.2f})" for k, v in times.items()]
    return (f"{name:<34} {cells[0]:>24} {cells[1]:>24} {med['torch'] / med['compiled']:>6.3f}x "
            f"{'same' if same else 'DIFFER':>7}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="demo,probe,facts")
    p.add_argument("--members", type=int, default=3, help="members folded into the batch (the demo's sweep: 3)")
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args(argv)
    if a.members < 1 or a.rounds < 1:
        raise SystemExit(f"bench_swiglu: --members and --rounds must be at least 1 (got {a.members}, {a.rounds})")
    import torch

    from sanlab.model import native
    from sanlab.train.host import tune_cpu_allocator

    shapes = a.shapes.split(",")
    if unknown := [s for s in shapes if s not in bm.SHAPES]:
        raise SystemExit(f"bench_swiglu: unknown shape(s) {', '.join(unknown)} (known: {', '.join(bm.SHAPES)})")
    if not native.available():  # (nothing to compare; `make bench` goes on)
        print(f"bench_swiglu: skipped, the compiled kernels are unavailable: {native.unavailable_reason()}")
        return 0
    tune_cpu_allocator()
    torch.set_num_threads(1)
    sleef = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; bf16, one thread, M {a.members}, "
          f"{a.rounds} rounds; torch's CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'':<34} {'torch ms (median)':>24} {'compiled ms (median)':>24} {'ratio':>7} {'bits':>7}")
    differ = False
    for shape in shapes:
        times, same = layer(shape, a.members, a.rounds)
        differ |= not same
        print(_row(f"{shape}: layer fwd+bwd", times, same), flush=True)
        for arm, cfg in bm.arm_configs(shape).items():
            if cfg.ffn:
                times, same = step(shape, arm, a.members, a.rounds)
                differ |= not same
                print(_row(f"{shape}: {arm} ({cfg.n_layers}L d{cfg.d_model}) step", times, same), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if differ and sleef:
        print("bench_swiglu: the compiled kernel's bits differ from torch's where its exp is SLEEF's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
