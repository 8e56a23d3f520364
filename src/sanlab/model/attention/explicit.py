"""The explicit attention kernel (PyTorch, a hand-written backward) and the reference
formula every attention kernel is tested against (`attention_reference`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sanlab.model.attention.masks import DOCUMENT, Mask

if TYPE_CHECKING:
    from sanlab.model.attention.context import AttentionContext
    from sanlab.model.layers import HookPoint


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√D masked to `allowed`) v in fp32, GQA by repeating K/V heads.
    q (B, H, T, D); k, v (B, Hkv, T, D); allowed (B, 1, T, T) bool."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    scores = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


# Where the fused kernel cannot run, the explicit kernel (`_ExplicitAttention`) runs on
# the CPU while the probabilities it keeps for the backward (`explicit_scores` values a
# layer, in v's dtype: bf16 under bf16 autocast) stay under this many bytes; SDPA beyond.
# Its errors are within 1.25x of SDPA's (tests/test_model.py); the speed that set the
# bound is in benchmarks/README.md ("Measurements behind the kernels").
CPU_EXPLICIT_MAX_BYTES = 64 << 20
# Query rows per block of the explicit kernel: blocks above the diagonal are skipped, so
# a causal layer computes ~(T + chunk)/(2T) of the full score matrix. 64 was the fastest
# block size measured (benchmarks/README.md).
EXPLICIT_CHUNK = 64


def explicit_scores(batch: int, heads: int, seq_len: int) -> int:
    """Probabilities the explicit kernel keeps for the backward (one layer)."""
    chunk = min(EXPLICIT_CHUNK, seq_len)
    return batch * heads * seq_len * (seq_len + chunk) // 2


def explicit_keep(batch: int, heads: int, seq_len: int, low: torch.dtype | None) -> torch.dtype | None:
    """The dtype the explicit kernel keeps its probabilities in, or None if they do not fit
    `CPU_EXPLICIT_MAX_BYTES` (one layer): fp32 where that fits; else `low` (bf16 under
    bf16 autocast: half the memory; gradients within 1.25x of SDPA's error, tested)
    where that fits. fp32 first because on the CPU the backward's P ⊙ (dP − δ) is slower
    with a bf16 P (a mixed-dtype product), which costs more than the bf16 copy saves while
    memory is not the limit (measured: benchmarks/README.md)."""
    n = explicit_scores(batch, heads, seq_len)
    if n * 4 <= CPU_EXPLICIT_MAX_BYTES:
        return torch.float32
    if low is not None and n * low.itemsize <= CPU_EXPLICIT_MAX_BYTES:
        return low
    return None


class _ExplicitAttention(torch.autograd.Function):
    """softmax(q kᵀ/√D + M) v in (at least) fp32, block-causal, with a hand-written backward.

    q (B, H, T, D); k, v (B, Hkv, T, D) in any dtype; bias (B, 1, T, T) additive mask in
    the compute dtype. GQA without copying K/V: the `rep` query heads of a KV group are
    stacked along the query axis, so every product is one (B·Hkv)-batched matmul.

    The query axis is cut into blocks of `chunk` rows; block [s, e) only meets keys [0, e)
    (the rest is masked by causality), so a layer computes ~(T + chunk)/(2T) of the
    score matrix and each block's scores are still in cache when they are normalised.
    The forward keeps each block's probabilities P, in `keep` (fp32, or bf16 where only
    that fits the memory bound: see `explicit_keep`); the backward is, per block,
    dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O)), dQ = dS K/√D, dK += dSᵀ Q/√D.
    The scores, the softmax, P V and dO Vᵀ (from which dS subtracts a row mean) are at
    least fp32: rounding the scores to bf16 would double the error at realistic score
    sizes. When the incoming gradient is bf16 (autocast), the three products that
    consume P or dS in the backward (Pᵀ dO, dS K, dSᵀ Q) run in bf16, as FlashAttention's
    do (faster on the CPU: benchmarks/README.md), with gradients within 1.25x of SDPA's
    error (tests/test_model.py). dK and dV
    accumulate over blocks in fp32; the result has v's dtype.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, chunk, keep):  # type: ignore[override]
        B, H, T, D = q.shape
        Hkv = k.shape[1]
        rep = H // Hkv
        dt = torch.promote_types(q.dtype, torch.float32)
        scale = D**-0.5  # (called with autocast off: see `_explicit`)
        q5 = (q.to(dt) * scale).reshape(B, Hkv, rep, T, D)  # scaled here: one pass over q, not over the scores
        k3 = k.to(dt).reshape(B * Hkv, T, D)
        v3 = v.to(dt).reshape(B * Hkv, T, D)
        out = torch.empty(B, Hkv, rep, T, D, dtype=dt, device=q.device)
        probs = []
        for s in range(0, T, chunk):
            e = min(T, s + chunk)
            qb = q5[:, :, :, s:e].reshape(B * Hkv, rep * (e - s), D)
            scores = torch.bmm(qb, k3[:, :e].transpose(1, 2))
            scores.view(B, Hkv, rep, e - s, e).add_(bias[:, :, None, s:e, :e])
            p = torch.softmax(scores, dim=-1)
            del scores
            out[:, :, :, s:e] = torch.bmm(p, v3[:, :e]).view(B, Hkv, rep, e - s, D)
            probs.append(p.to(keep))
        ctx.save_for_backward(q5, k3, v3, out, *probs)
        ctx.chunk, ctx.dtypes = chunk, (q.dtype, k.dtype, v.dtype)
        return out.view(B, H, T, D).to(v.dtype)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        with torch.autocast(dout.device.type, enabled=False):  # fp32 products even if backward() runs under autocast
            return _ExplicitAttention._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout):  # noqa: ANN001, ANN205
        q5, k3, v3, out, *probs = ctx.saved_tensors
        B, Hkv, rep, T, D = q5.shape
        lp = dout.dtype if dout.dtype in (torch.bfloat16, torch.float16) else q5.dtype
        chunk, scale = ctx.chunk, D**-0.5
        do5 = dout.to(q5.dtype).reshape(B, Hkv, rep, T, D)
        do5_lp = dout.reshape(B, Hkv, rep, T, D) if lp == dout.dtype else do5
        q5_lp, k3_lp = q5.to(lp), k3.to(lp)
        delta = torch.linalg.vecdot(do5, out).unsqueeze(-1)  # rowsum(dO ⊙ O) = rowsum(P ⊙ dP)
        dq = torch.empty_like(q5)
        dk, dv = torch.zeros_like(k3), torch.zeros_like(v3)
        for p, s in zip(probs, range(0, T, chunk)):
            e = min(T, s + chunk)
            n = rep * (e - s)
            dob = do5[:, :, :, s:e].reshape(B * Hkv, n, D)
            dv[:, :e] += torch.bmm(p.to(lp).transpose(1, 2), do5_lp[:, :, :, s:e].reshape(B * Hkv, n, D))  # (no copy if kept in lp)
            ds = torch.bmm(dob, v3[:, :e].transpose(1, 2))
            ds.view(B, Hkv, rep, e - s, e).sub_(delta[:, :, :, s:e]).mul_(p.view(B, Hkv, rep, e - s, e))
            ds = ds.to(lp)
            dq[:, :, :, s:e] = torch.bmm(ds, k3_lp[:, :e]).view(B, Hkv, rep, e - s, D)
            dk[:, :e] += torch.bmm(ds.transpose(1, 2), q5_lp[:, :, :, s:e].reshape(B * Hkv, n, D))
        qt, kt, vt = ctx.dtypes
        H = Hkv * rep
        return (dq.mul_(scale).view(B, H, T, D).to(qt), dk.view(B, Hkv, T, D).to(kt),  # (q5 is scaled)
                dv.view(B, Hkv, T, D).to(vt), None, None, None)


def explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext, pattern_hook: HookPoint | None,
    mask: Mask = DOCUMENT,
) -> torch.Tensor:
    """The explicit kernel under `mask` (`ctx.additive_mask`); with a
    pattern hook, plain autograd ops that materialise the whole (B, H, T, T) probability
    tensor for the hook (same arithmetic, fp32 scores)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # keep the scores in fp32 under autocast
        bias = ctx.additive_mask(dt, mask)
        if pattern_hook is None:
            B, H, T, _ = q.shape
            keep = explicit_keep(B, H, T, v.dtype if v.dtype.itemsize == 2 else None)
            keep = dt if keep in (None, torch.float32) else keep  # (None: the backend was forced)
            return _ExplicitAttention.apply(q, k, v, bias, EXPLICIT_CHUNK, keep)
        B, H, T, D = q.shape
        Hkv = k.shape[1]
        q5 = (q.to(dt) * D**-0.5).reshape(B, Hkv, H // Hkv, T, D)
        scores = q5 @ k.to(dt)[:, :, None].transpose(-1, -2) + bias[:, :, None]  # (B, Hkv, rep, T, T)
        probs = pattern_hook(torch.softmax(scores, dim=-1).view(B, H, T, T))
        out = probs.view(B, Hkv, H // Hkv, T, T) @ v.to(dt)[:, :, None]
        return out.to(v.dtype).view(B, H, T, D)
