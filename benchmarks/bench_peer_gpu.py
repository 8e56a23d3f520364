"""Training throughput of sanlab's standard arm against Hugging Face's LlamaForCausalLM on
one accelerator (issue 43's peer check; `bench_train.py` is the CPU comparison).

Same shape (d, layers, heads with GQA, d_ff, vocab, seq_len, rows), bf16 autocast on
CUDA, torch's fused AdamW, the same step (forward, CE loss, backward, clip, optimizer
step), unpacked rows, both `torch.compile`d on CUDA (sanlab as train.compile does:
`LM.compile_layers`). The two models' steps alternate, so a drift in the machine's
speed hits both; each arm's tokens/s is the median of its timed steps. MFU is against
a bf16 matmul peak measured in the same run. Target: sanlab ≥ 1.3x Llama.

    python benchmarks/bench_peer_gpu.py                       # CUDA, 4L d512 8/4 heads, V 16,384, T 2,048, 16 rows
    python benchmarks/bench_peer_gpu.py --device cpu --tiny   # a seconds-long smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from sanlab.cliargs import ArgumentParser, device_name, non_negative_int, positive_int, script_main


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    p = ArgumentParser(prog="bench_peer_gpu.py", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", type=device_name, default=None,
                   help="default: cuda; skipped (exit 0) when there is none")
    p.add_argument("--d", type=positive_int, default=512)
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=4)
    p.add_argument("--vocab", type=positive_int, default=16384)
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument("--rows", type=positive_int, default=16)
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--tiny", action="store_true", help="small shapes for a smoke run")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    a = p.parse_args(argv)
    if a.device is None and not torch.cuda.is_available():
        print("bench_peer_gpu: no CUDA device; skipped (--device cpu --tiny for a smoke run)")
        return 0
    device = torch.device(a.device or "cuda")
    if a.tiny:
        a.d, a.layers, a.heads, a.kv_heads, a.vocab, a.seq_len, a.rows, a.steps, a.warmup = 64, 2, 4, 2, 256, 64, 4, 3, 1
    if a.compile is None:
        a.compile = device.type == "cuda"
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        print("bench_peer_gpu: transformers is not installed; skipped")
        return 0
    from sanlab.accounting import count_flops
    from sanlab.config import ModelConfig, validate
    from sanlab.model.lm import LM

    d_ff = 4 * a.d
    cfg = validate(ModelConfig, dict(d_model=a.d, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                                     vocab_size=a.vocab, ffn=True, d_ff=d_ff), source="flags")
    torch.manual_seed(0)
    ours = LM(cfg).to(device)
    if a.compile:
        ours.compile_layers()
    llama = LlamaForCausalLM(LlamaConfig(
        hidden_size=a.d, intermediate_size=d_ff, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, vocab_size=a.vocab, max_position_embeddings=a.seq_len,
        tie_word_embeddings=True, attention_bias=False)).to(device)
    llama_fwd = torch.compile(llama) if a.compile else llama
    tokens = torch.randint(0, a.vocab, (a.rows, a.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = torch.ones_like(inputs, dtype=torch.bool)
    bf16 = device.type == "cuda"

    def loss_ours():
        return ours(inputs, None, targets, mask, 1e-4)[0]  # the trainer's fused head + loss

    def loss_llama():
        logits = llama_fwd(input_ids=inputs).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    arms = {"sanlab": (ours, loss_ours), "llama": (llama, loss_llama)}
    opts = {n: torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=True) for n, (m, _) in arms.items()}
    times: dict[str, list[float]] = {n: [] for n in arms}
    for i in range(a.warmup + a.steps):
        for name, (model, loss_fn) in arms.items():  # steps alternate
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            _sync(device)
            if i >= a.warmup:
                times[name].append(time.perf_counter() - t0)
    n = 4096 if device.type == "cuda" else 512
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
    x @ x
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        x @ x
    _sync(device)
    peak = 2 * n**3 * 10 / (time.perf_counter() - t0)
    flops = count_flops(cfg, a.seq_len).train
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"peer benchmark on {name}: d={a.d} L={a.layers} H={a.heads}/{a.kv_heads} V={a.vocab} T={a.seq_len} "
          f"rows={a.rows} {'bf16' if bf16 else 'fp32'} {'compiled' if a.compile else 'eager'}; "
          f"matmul peak {peak / 1e12:.1f} TFLOP/s")
    tps = {}
    for arm, ts in times.items():
        tps[arm] = a.rows * a.seq_len / statistics.median(ts)
        print(f"  {arm:7s} {tps[arm]:>12,.0f} tok/s  MFU {tps[arm] * flops / peak:6.1%}")
    print(f"sanlab / llama tokens/s: {tps['sanlab'] / tps['llama']:.2f}x (target >= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
