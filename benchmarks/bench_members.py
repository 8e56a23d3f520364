"""A sweep trained as members of one batched model against the same sweep as solo runs.

    .venv/bin/python benchmarks/bench_members.py [--shapes demo,probe,facts] [--members 1,2,4,8,16]
    python benchmarks/bench_members.py --device cuda [--shapes demo] [--members 1,2,4,8,16]

For each shape and member count M, the same M runs (one arm's sweep points: same
architecture, different LR and seed) are trained, forward + backward + clip + optimizer,
on rows of the shape's batch, as:

- `solo`: M solo `LM`s stepped one after another in one process (all threads);
- `runner`: today's best runner setting on this machine, `runner.workers=2,
  runner.threads=1`: two processes side by side, each stepping half of the solo runs
  (M = 1: the one run with all threads);
- `members`: one `MemberLM` of M members with `MemberOptim` (`sanlab.train.members`) in
  one process (all threads);
- `members x2`: two processes side by side, each with M/2 members and one thread;
- `vmap` (`--vmap`, SAN shapes): the `torch.func` route, `stack_module_state` + `vmap` of
  `grad` over a functional model. It cannot run sanlab's own model: the project's kernels are
  hand-written `autograd.Function`s (no `setup_context`, ctypes calls on data pointers) and
  torch.func refuses them (the error is printed). So it is timed on the same architecture
  written in plain formulas (RMS norm, RoPE, SDPA, cross-entropy), against that plain model
  stepped solo (`vmap solo`), with one AdamW over the stacked weights.

With `--device cuda` (a GPU; `--device cpu` is its dry run) the comparison runs in one
process on the device: `solo`, the M runs one after another (each model's layers compiled,
as `train.compile=auto` runs them on CUDA; one run at a time is a GPU's runner), against
`members` (eager), alternating step by step, with tokens/s, % of the device's bf16 matmul
peak and the device memory each mode added.

In-process modes alternate step by step in one child process; the two-process modes run
after them, the order reversed every round. The tables give tokens/s in total and per
member, the ratio against `runner` measured in the same run, the % of a bf16 matmul peak
measured in the same run (training FLOPs from `sanlab.accounting`), and each process's
peak RSS. The load average is printed: the CPU here is shared.

The route chosen: native batched modules (`sanlab.model.members`). They run the project's
kernels unchanged on each member's slice, so a member's losses equal its solo run's (bit for
bit on the test shapes), where the vmap route needs plain formulas the solo model does not
run (different numerics, and slower on the CPU: see the `vmap` rows).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time
from pathlib import Path
from typing import Any

from _children import run_children

from sanlab.cliargs import ArgumentParser, device_name, non_negative_int, positive_int, script_main
from sanlab.errors import ConfigError
from sanlab.paths import check_out_file

SHAPES = {
    # the demo (examples/quick.toml): SAN 5L d64, T128, vocab 1024, batch 16, and its partners
    "demo": dict(d=64, layers=5, heads=4, kv_heads=2, vocab=1024, seq_len=128, batch=16, docs=1,
                 partners=("iso_param", "iso_flop", "iso_depth")),
    # the probe model (sanlab.probes.runner): the standard arm, d64 2 layers, rows of 256, batch 8, packed
    "probe": dict(d=64, layers=2, heads=4, kv_heads=2, vocab=256, seq_len=256, batch=8, docs=8, ffn=True,
                  partners=()),
    # the facts-axis record: SAN 5L d32, T128, vocab 1024, batch 16, and its iso-param partner
    "facts": dict(d=32, layers=5, heads=4, kv_heads=2, vocab=1024, seq_len=128, batch=16, docs=1,
                  partners=("iso_param",)),
}


def arm_configs(shape: str) -> dict[str, Any]:
    from sanlab.config import ModelConfig
    from sanlab.matching import match

    s = SHAPES[shape]
    ref = ModelConfig(d_model=s["d"], n_layers=s["layers"], n_heads=s["heads"], n_kv_heads=s["kv_heads"],
                      vocab_size=s["vocab"], ffn=s.get("ffn", False))
    out = {"standard" if s.get("ffn") else "san": ref}
    if s["partners"]:
        arms = match(ref, s["seq_len"], targets=tuple({"iso_param": "params", "iso_flop": "flops",
                                                      "iso_depth": "depth"}[p] for p in s["partners"]),
                     policy="nearest")
        out |= {p: a.config for p, a in zip(s["partners"], arms[1:])}  # arms[0] is the reference
    return out


def _batch(shape: str, M: int, seed: int, device: str = "cpu") -> dict[str, Any]:
    import torch

    s = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, s["vocab"], (M, s["batch"], s["seq_len"] + 1), generator=g)
    seg = (torch.arange(s["seq_len"]) // (s["seq_len"] // s["docs"])).expand(M, s["batch"], -1).contiguous()
    b = {"inputs": rows[..., :-1].contiguous(), "targets": rows[..., 1:].contiguous(), "segment_ids": seg,
         "loss_mask": torch.ones(M, s["batch"], s["seq_len"], dtype=torch.bool)}
    return {k: v.to(device) for k, v in b.items()}


class Solo:
    """M solo runs stepped one after another, as M trainer processes would step them (on a
    GPU, `compile`: each model's layers compiled, as `train.compile=auto` runs there)."""

    def __init__(self, cfg: Any, shape: str, M: int, bf16: bool, device: str = "cpu", compile: bool = False) -> None:
        import torch

        from sanlab.config import OptimConfig
        from sanlab.model.lm import LM
        from sanlab.train.optim import build_optimizers

        self.runs = []
        for m in range(M):
            torch.manual_seed(m)
            model = LM(cfg).to(device)
            if compile:
                model.compile_layers(print)
            self.runs.append((model, build_optimizers(model, OptimConfig(lr=0.02 * 2 ** (m % 3 - 1)))))
        self.b, self.bf16, self.device = _batch(shape, M, 0, device), bf16, device

    def step(self) -> None:
        import torch

        from sanlab.train.optim import clip_grad_norm

        for m, (model, opt) in enumerate(self.runs):
            with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.bf16):
                loss, _ = model(self.b["inputs"][m], self.b["segment_ids"][m], self.b["targets"][m],
                                self.b["loss_mask"][m], 1e-4)
            loss.backward()
            clip_grad_norm(opt.params(), 1.0)
            opt.step()
            opt.zero_grad()


class Members:
    """The same runs as one `MemberLM` with `MemberOptim`, as `train_members` steps them."""

    def __init__(self, cfg: Any, shape: str, M: int, bf16: bool, device: str = "cpu") -> None:
        import torch

        from sanlab.config import OptimConfig
        from sanlab.model.members import build_members
        from sanlab.train.members import MemberOptim
        from sanlab.train.optim import route

        from sanlab.train.host import resolve_precision

        self.model = build_members(cfg, list(range(M))).to(device)
        cfgs = [OptimConfig(lr=0.02 * 2 ** (m % 3 - 1)) for m in range(M)]
        # Muon's iterations in the precision the solo runs' optimizer resolves (`build_optimizers`:
        # bf16 where the CPU has bf16 products, fp32 where it would emulate them)
        ns = {"bf16": torch.bfloat16, "fp32": torch.float32}[resolve_precision(cfgs[0].ns_precision, device)]
        self.opt = MemberOptim(self.model, cfgs, ns)
        from sanlab.model.lm import LM

        self.opt.groups = {g: [n for n, _ in v] for g, v in route(LM(cfg)).items() if g != "frozen"}
        self.names = self.opt.params_order()
        self.M, self.b, self.bf16, self.device = M, _batch(shape, M, 0, device), bf16, device

    def step(self) -> None:
        import torch

        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.bf16):
            loss, _ = self.model(self.b["inputs"], self.b["segment_ids"], self.b["targets"], self.b["loss_mask"],
                                 1e-4)
        loss.sum().backward()
        for m in range(self.M):  # the per-member clip, as the trainer does it
            grads = [self.model.by_name[n].grad[m] for n in self.names]
            total = torch.nn.utils.get_total_norm(grads)
            torch._foreach_mul_(grads, torch.clamp(1.0 / (total + 1e-6), max=1.0))
        self.opt.step(list(range(self.M)), {m: 1.0 for m in range(self.M)})
        for p in self.model.parameters():
            p.grad = None


# ---- the torch.func route, on the architecture in plain formulas


def _plain_params(cfg: Any, seed: int) -> dict[str, Any]:
    import torch

    from sanlab.model.lm import LM

    torch.manual_seed(seed)
    return {n: p.detach().clone() for n, p in LM(cfg).named_parameters()}


def _plain_loss(cfg: Any, p: dict[str, Any], tokens: Any, targets: Any) -> Any:
    """The SAN (or standard arm) in plain formulas: what torch.func can batch. Single
    document rows (causal SDPA)."""
    import torch
    import torch.nn.functional as F

    def norm(x: Any, w: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * (1 + w)

    B, T = tokens.shape
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()

    def rope(x: Any) -> Any:
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = F.embedding(tokens, p["embed.weight"]) * math.sqrt(cfg.d_model)
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        u = norm(x, p[b + "attn_norm.weight"])
        q = (u @ p[b + "attn.wq.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (u @ p[b + "attn.wk.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (u @ p[b + "attn.wv.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(norm(q, p[b + "attn.q_norm.weight"])), rope(norm(k, p[b + "attn.k_norm.weight"]))
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True)
        x = x + torch.sigmoid(p[b + "attn_gate"]) * (y.transpose(1, 2).reshape(B, T, H * D) @ p[b + "attn.wo.weight"].T)
        if cfg.ffn:
            u = norm(x, p[b + "ffn_norm.weight"])
            gate, up = u @ p[b + "ffn.w_gate.weight"].T, u @ p[b + "ffn.w_up.weight"].T
            x = x + torch.sigmoid(p[b + "ffn_gate"]) * ((F.silu(gate) * up) @ p[b + "ffn.w_down.weight"].T)
    x = norm(x, p["final_norm.weight"])
    logits = (x @ p["embed.weight"].T).float()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


class VmapMembers:
    """`stack_module_state`'s layout (stacked weights) stepped by `vmap(grad(loss))` and one AdamW."""

    def __init__(self, cfg: Any, shape: str, M: int, bf16: bool) -> None:
        import torch
        from torch.func import grad, vmap

        self.cfg, self.bf16 = cfg, bf16
        per = [_plain_params(cfg, m) for m in range(M)]
        self.params = {n: torch.stack([p[n] for p in per]).requires_grad_(False) for n in per[0]}
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=1e-3, fused=True)
        b = _batch(shape, M, 0)
        self.tokens, self.targets = b["inputs"], b["targets"]
        self.fn = vmap(grad(lambda p, t, y: _plain_loss(cfg, p, t, y)))

    def step(self) -> None:
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            grads = self.fn(self.params, self.tokens, self.targets)
        for n, p in self.params.items():
            p.grad = grads[n]
        self.opt.step()


class VmapSolo(VmapMembers):
    """The plain-formula model of `VmapMembers`, M runs stepped one after another."""

    def __init__(self, cfg: Any, shape: str, M: int, bf16: bool) -> None:
        import torch
        from torch.func import grad

        self.cfg, self.bf16 = cfg, bf16
        self.runs = []
        b = _batch(shape, M, 0)
        for m in range(M):
            p = _plain_params(cfg, m)
            self.runs.append((p, torch.optim.AdamW(list(p.values()), lr=1e-3, fused=True),
                              b["inputs"][m], b["targets"][m]))
        self.fn = grad(lambda p, t, y: _plain_loss(cfg, p, t, y))

    def step(self) -> None:
        import torch

        for p, opt, t, y in self.runs:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                grads = self.fn(p, t, y)
            for n, w in p.items():
                w.grad = grads[n]
            opt.step()


def vmap_error(cfg: Any) -> str:
    """What torch.func says to vmap over sanlab's own model."""
    import copy

    import torch
    from torch.func import functional_call, grad, stack_module_state, vmap

    from sanlab.model.lm import LM

    models = [LM(cfg) for _ in range(2)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    tok = torch.zeros(2, 2, 16, dtype=torch.long)
    mask = torch.ones(2, 2, 16, dtype=torch.bool)
    try:
        vmap(grad(lambda p, b, t, m: functional_call(base, (p, b), (t, None, t, m))[0]))(params, buffers, tok, mask)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    return "ran"


KINDS = {"solo": Solo, "members": Members, "vmap": VmapMembers, "vmap solo": VmapSolo}


def _child(job: dict[str, Any], queue: Any, barrier: Any = None) -> None:
    """Build the job's steppers, warm up, then time them step by step, alternating."""
    import warnings

    import torch

    from sanlab.train.host import tune_cpu_allocator

    # (vmap's fallback for SDPA warns on every call: its cost is what the vmap rows show)
    warnings.filterwarnings("ignore", message="There is a performance drop")
    tune_cpu_allocator()
    torch.set_num_threads(job["threads"])
    cfg = arm_configs(job["shape"])[job["arm"]]
    steppers = {k: KINDS[k](cfg, job["shape"], job["M"], job["bf16"]) for k in job["kinds"]}
    for s in steppers.values():
        s.step()
    if barrier is not None:
        barrier.wait()
    times: dict[str, list[float]] = {k: [] for k in steppers}
    t_all = time.perf_counter()
    order = list(steppers)
    for i in range(job["steps"]):
        for k in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            steppers[k].step()
            times[k].append(time.perf_counter() - t0)
    queue.put({"times": times, "wall": time.perf_counter() - t_all,
               "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def run_job(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the jobs as processes side by side (started together after their warmup)."""
    return run_children("bench_members", _child, [(j,) for j in jobs], barrier=len(jobs) > 1)


def matmul_peak(threads: int, precision: str = "bf16") -> float:
    """Matmul FLOP/s in `precision` on this machine now (best of a few 1024³ products)."""
    import torch

    torch.set_num_threads(threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    best = math.inf
    for _ in range(8):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def measure(shape: str, arm: str, M: int, a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """tokens/s in total for each mode, median over the timed steps."""
    s = SHAPES[shape]
    tokens = M * s["batch"] * s["seq_len"]
    kinds = ["solo", "members"] + (["vmap", "vmap solo"] if a.vmap and arm == "san" and shape == "demo" else [])
    base = dict(shape=shape, arm=arm, bf16=a.precision == "bf16", steps=a.steps)
    res: dict[str, dict[str, float]] = {}
    for r in range(a.rounds):
        phases = ["inproc", "runner", "members x2"]
        for phase in phases if r % 2 == 0 else phases[::-1]:
            if phase == "inproc":
                out = run_job([dict(base, M=M, threads=2, kinds=kinds)])[0]
                for k, ts in out["times"].items():
                    res.setdefault(k, {"tps": [], "rss": []})
                    res[k]["tps"].append(tokens / median(ts))
                    res[k]["rss"].append(out["rss_mib"])
                continue
            if M == 1:
                continue
            kind = "solo" if phase == "runner" else "members"
            outs = run_job([dict(base, M=M // 2, threads=1, kinds=[kind]),
                            dict(base, M=M - M // 2, threads=1, kinds=[kind])])
            tps = sum((M // 2 if i == 0 else M - M // 2) * s["batch"] * s["seq_len"] / median(o["times"][kind])
                      for i, o in enumerate(outs))
            res.setdefault(phase, {"tps": [], "rss": []})
            res[phase]["tps"].append(tps)
            res[phase]["rss"].append(max(o["rss_mib"] for o in outs))
    if M == 1:
        res["runner"] = res["solo"]
    return {k: {"tps": median(v["tps"]), "rss": max(v["rss"])} for k, v in res.items()}


def timed_arms(a: argparse.Namespace, header: str) -> Any:
    """(shape, arm, its config, the member counts to time, its training FLOPs a token) for
    each shape and arm the flags ask for, after printing the arm's line and `header`."""
    from sanlab.accounting import accounting_summary

    for shape in a.shapes.split(","):
        s = SHAPES[shape]
        for arm, cfg in arm_configs(shape).items():
            counts = a.members if arm in ("san", "standard") else a.partner_members
            if not counts:
                continue
            print(f"\n{shape} / {arm}: {cfg.n_layers}L d{cfg.d_model} ffn={cfg.ffn} T{s['seq_len']} "
                  f"batch {s['batch']} vocab {cfg.vocab_size}")
            print(header)
            yield shape, arm, cfg, counts, accounting_summary(cfg, s["seq_len"])["train_flops_per_token"]


def device_peak(device: str, precision: str = "bf16") -> float:
    """Matmul FLOP/s in `precision` on `device` now (best of a few 4096³ products; on a CPU,
    as `matmul_peak` with every thread, so a CPU without bf16 products is measured in the
    fp32 that `auto` trains in, not in its emulated bf16)."""
    import torch

    if not device.startswith("cuda"):
        return matmul_peak(torch.get_num_threads(), precision)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    a, b = (torch.randn(4096, 4096, dtype=dtype, device=device) for _ in range(2))
    best = math.inf
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * 4096**3 / best


def measure_device(shape: str, arm: str, M: int, a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One process on `a.device`: `solo` (the M runs one after another, each model compiled
    on CUDA as `train.compile=auto` runs it there; one run a GPU is today's runner) and
    `members`, step by step alternating, synchronised around each step. tokens/s in total
    (median) and the device memory each mode's models, optimizers and steps added (MiB)."""
    import torch

    s = SHAPES[shape]
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = arm_configs(shape)[arm]
    bf16 = a.precision == "bf16"
    steppers: dict[str, Any] = {}
    mem: dict[str, float] = {}
    for kind in ("solo", "members"):
        before = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        steppers[kind] = (Solo(cfg, shape, M, bf16, a.device, compile=cuda and not a.no_compile) if kind == "solo"
                          else Members(cfg, shape, M, bf16, a.device))
        for _ in range(a.warmup):  # (the compile happens here)
            steppers[kind].step()
        sync()
        mem[kind] = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else math.nan
    times: dict[str, list[float]] = {k: [] for k in steppers}
    order = list(steppers)
    for i in range(a.steps):
        for k in order if i % 2 == 0 else order[::-1]:
            sync()
            t0 = time.perf_counter()
            steppers[k].step()
            sync()
            times[k].append(time.perf_counter() - t0)
    tokens = M * s["batch"] * s["seq_len"]
    return {k: {"tps": tokens / median(times[k]), "mem": mem[k]} for k in steppers}


def device_main(a: argparse.Namespace) -> int:
    """--device: the in-process comparison on one device (a GPU; `cpu` is its dry run)."""
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {a.device}: no CUDA device is available")
    name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "CPU"
    peak = device_peak(a.device, a.precision)
    print(f"{name}, torch {torch.__version__}; {a.precision}; {a.steps} timed steps after {a.warmup} warmup; "
          f"{a.precision} matmul peak {peak / 1e12:.2f} TFLOP/s")
    header = f"{'M':>3} {'mode':<8} {'tok/s total':>12} {'per member':>11} {'vs solo':>8} {'% peak':>7} {'MiB':>7}"
    for shape, arm, cfg, counts, flops in timed_arms(a, header):
        for M in counts:
            res = measure_device(shape, arm, M, a)
            for k, v in res.items():
                print(f"{M:>3} {k:<8} {v['tps']:>12,.0f} {v['tps'] / M:>11,.0f} "
                      f"{v['tps'] / res['solo']['tps']:>7.2f}x {100 * v['tps'] * flops / peak:>6.2f}% "
                      f"{'-' if math.isnan(v['mem']) else format(v['mem'], '.0f'):>7}", flush=True)
    return 0


def draw_scaling(results: dict[str, dict[int, dict[str, float]]], path: str) -> Any:
    """The scaling curve: for each shape and arm timed at two or more member counts, tokens/s
    in total against M, one line a mode, and below it each mode's ratio to the runner with
    the issue's 3× target. Returns the figure (closed; its axes keep the data)."""
    import matplotlib  # lazy: only --figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    panels = [(k, v) for k, v in results.items() if len(v) >= 2]
    fig, ax = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 6.4), squeeze=False, sharex="col",
                           gridspec_kw={"height_ratios": [3, 2]})
    for j, (title, by_m) in enumerate(panels):
        Ms = sorted(by_m)
        modes = list(dict.fromkeys(k for M in Ms for k in by_m[M]))
        for mode in modes:
            xs = [M for M in Ms if mode in by_m[M]]
            ax[0][j].plot(xs, [by_m[M][mode] for M in xs], marker="o", label=mode)
            ax[1][j].plot(xs, [by_m[M][mode] / by_m[M]["runner"] for M in xs], marker="o", label=mode)
        ax[1][j].axhline(3.0, ls="--", color="0.5", label="the 3× target")
        ax[0][j].set_title(title, fontsize=9)
        ax[0][j].set_ylabel("tokens/s, total")
        ax[1][j].set_ylabel("× the runner")
        ax[1][j].set_xlabel("members M (runs in the sweep)")
        ax[1][j].set_xscale("log", base=2)
        ax[1][j].set_xticks(Ms, [str(M) for M in Ms])
        ax[1][j].set_ylim(0, 3.3)
        ax[0][j].set_ylim(bottom=0)
        for a in ax[:, j]:
            a.grid(alpha=0.3)
        ax[0][j].legend(fontsize=7)
    ax[1][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # (check_out_file allowed it)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def member_counts(text: str) -> list[int]:
    """A comma-separated list of member counts >= 1 ("0" or empty: none), for argparse."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip() not in ("", "0")]
    except ValueError:
        counts = [0]
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: member counts are integers >= 1, comma-separated (0: none)")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="bench_members.py", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="demo,probe,facts", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--members", default="1,2,4,8,16", type=member_counts)
    p.add_argument("--partner-members", default="8", type=member_counts,
                   help="member counts for the partner arms (0: none)")
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per mode (after one warmup step)")
    p.add_argument("--rounds", type=positive_int, default=1)
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="auto: bf16 where the CPU (or GPU) has bf16 products, else fp32, as training resolves it")
    p.add_argument("--vmap", action="store_true", help="also time the torch.func route (demo SAN)")
    p.add_argument("--figure", default=None, help="also draw the scaling curve into this PNG")
    p.add_argument("--device", default=None, type=device_name,
                   help="time solo runs against members in one process on this device (cuda; cpu: a dry run)")
    p.add_argument("--warmup", type=non_negative_int, default=2,
                   help="--device: untimed steps per mode (the compile's)")
    p.add_argument("--no-compile", action="store_true", help="--device cuda: the solo models eager")
    a = p.parse_args(argv)
    unknown = [x for x in a.shapes.split(",") if x not in SHAPES]
    if unknown:  # refused now, not after minutes of timing the known ones
        raise ConfigError(f"--shapes: unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    if a.figure:
        check_out_file(a.figure, "--figure")  # (a directory, an unwritable or impossible path: refused now)
        if a.device is not None:
            raise ConfigError("--figure draws the runner comparison, not --device's")
        if len(a.members) < 2 and len(a.partner_members) < 2:
            raise ConfigError("--figure needs two or more member counts (--members)")
    from sanlab.train.host import resolve_precision

    a.precision = resolve_precision(a.precision, "cuda" if (a.device or "cpu").startswith("cuda") else "cpu")
    if a.device is not None:
        return device_main(a)

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {a.precision}; "
          f"{a.steps} timed steps x {a.rounds} round(s)")
    if a.vmap:
        print("vmap over sanlab's LM:", vmap_error(arm_configs("demo")["san"]))
    peak = run_peak(a.precision)
    print(f"{a.precision} matmul peak (2 threads, 1024^3): {peak / 1e9:.0f} GFLOP/s")
    results: dict[str, dict[int, dict[str, float]]] = {}
    header = (f"{'M':>3} {'mode':<11} {'tok/s total':>12} {'per member':>11} {'vs runner':>10} {'% peak':>7} "
              f"{'RSS MiB':>8}")
    for shape, arm, cfg, counts, flops in timed_arms(a, header):
        for M in counts:
            res = measure(shape, arm, M, a)
            results.setdefault(f"{shape} / {arm} ({cfg.n_layers}L d{cfg.d_model})", {})[M] = {
                k: v["tps"] for k, v in res.items()}
            ref = res["runner"]["tps"]
            for k, v in res.items():
                if k == "runner" and M == 1:
                    continue
                print(f"{M:>3} {k:<11} {v['tps']:>12,.0f} {v['tps'] / M:>11,.0f} {v['tps'] / ref:>9.2f}x "
                      f"{100 * v['tps'] * flops / peak:>6.1f}% {v['rss']:>8.0f}", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if a.figure:
        draw_scaling(results, a.figure)
        print(a.figure)
    return 0


def _peak_child(precision: str, queue: Any) -> None:
    queue.put(matmul_peak(2, precision))


def run_peak(precision: str = "bf16") -> float:
    return run_children("bench_members", _peak_child, [(precision,)])[0]


if __name__ == "__main__":
    raise SystemExit(script_main(main))
