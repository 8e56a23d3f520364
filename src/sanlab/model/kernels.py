"""Hand-written autograd kernels, each beside the plain formula it is tested against.

Every kernel here computes exactly its reference formula (`*_reference`, plain PyTorch,
autograd's backward) with fewer passes over the activations or less memory; the tests
compare each one with its reference (values and gradients, fp32 and bf16 autocast).
Model code calls the public wrappers (`rms_norm`, `rope`, `norm_rope`, `gated_residual`,
`silu_gate`, `attend`, `head_loss`); a variant is written in plain PyTorch and may opt into any of
them. Under `torch.compile` the kernels fall back to their plain formulas where inductor
needs them to (it rejects `out=` into views).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from sanlab.model import native

# --------------------------------------------------------------------------- dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (norms and RoPE run in fp32, SPEC §1.1); fp64 stays fp64 so
    property tests can be exact."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()




# --------------------------------------------------------------------------- RMS norm


def rms_norm_reference(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """x · (mean(x²) + eps)^-½ · gain over the last dim (the formula of `rms_norm`)."""
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * gain


def rms_norm(x32: torch.Tensor, gain: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """`rms_norm_reference(x32, gain, eps)` written in `out_dtype` (x32 at least fp32)."""
    if (_native_ready(x32) and x32.dtype == gain.dtype == torch.float32 and x32.is_contiguous()
            and out_dtype in _FUSED_DTYPES):
        return _NativeRMSNorm.apply(x32, gain, eps, out_dtype)
    return _RMSNorm.apply(x32, gain, eps, out_dtype)


def _native_ready(x: torch.Tensor) -> bool:
    """Whether the compiled kernels may run on x: a CPU tensor, eager mode (inductor
    compiles the plain formulas instead), and the library built here."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling() and native.available()


class _NativeRMSNorm(torch.autograd.Function):
    """`_RMSNorm` by the compiled kernel (`csrc/norms.c`): one pass each way (rows of d
    values stay in cache between the reduction and the write); dγ summed in fixed chunks
    of rows, so it does not depend on the thread count."""

    @staticmethod
    def forward(ctx, x, gain, eps, out_dtype):  # type: ignore[override]
        d = x.shape[-1]
        out = torch.empty(x.shape, dtype=out_dtype)
        r = torch.empty(x.shape[:-1], dtype=torch.float32)
        gain = gain.contiguous()
        _native_call(native.library().sanlab_rms_norm_fwd, x.numel() // d, d, x.data_ptr(), gain.data_ptr(), eps,
                     out.data_ptr(), int(out_dtype == torch.bfloat16), r.data_ptr(), torch.get_num_threads())
        ctx.save_for_backward(x, gain, r)
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, gain, r = ctx.saved_tensors
        d = x.shape[-1]
        if dy.dtype not in _FUSED_DTYPES or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dx = torch.empty_like(x)
        dgain = torch.empty(d, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        _native_call(native.library().sanlab_rms_norm_bwd, x.numel() // d, d, x.data_ptr(), gain.data_ptr(),
                     r.data_ptr(), dy.data_ptr(), int(dy.dtype == torch.bfloat16), dx.data_ptr(),
                     None if dgain is None else dgain.data_ptr(), torch.get_num_threads())
        return dx, dgain, None, None


class _RMSNorm(torch.autograd.Function):
    """y = x · r · γ with r = (mean(x²) + eps)^-½ over the last dim, and its backward:
    dx = r·(dy⊙γ) − x·r³·⟨dy⊙γ, x⟩/d,  dγ = Σ_rows r·(dy⊙x).

    The same function as `F.rms_norm`, whose CPU autograd graph makes ~10 passes over
    the activations in the backward alone; this makes 2 in the forward and 5 in the
    backward (norms run on every residual read and on every q and k head).
    """

    @staticmethod
    def forward(ctx, x, gain, eps, out_dtype):  # type: ignore[override]
        d = x.shape[-1]
        with torch.autocast(x.device.type, enabled=False):  # autocast would run vecdot in bf16
            r = torch.linalg.vecdot(x, x).unsqueeze(-1).div_(d).add_(eps).rsqrt_()  # (..., 1)
        ctx.save_for_backward(x, gain, r)
        if out_dtype == x.dtype:
            return (x * r).mul_(gain)
        return torch.mul(x * r, gain, out=torch.empty(x.shape, dtype=out_dtype, device=x.device))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, gain, r = ctx.saved_tensors
        d = x.shape[-1]
        dgain = None
        if ctx.needs_input_grad[1]:
            with torch.autocast(x.device.type, enabled=False):  # backward() may run under autocast
                dgain = (dy * x).reshape(-1, d).t() @ r.reshape(-1)
        dyg = dy * gain
        with torch.autocast(x.device.type, enabled=False):
            c = torch.linalg.vecdot(dyg, x).unsqueeze(-1).mul_(r.pow(3)).div_(-d)  # −r³⟨dy⊙γ, x⟩/d
        return dyg.mul_(r).addcmul_(x, c), dgain, None, None




# --------------------------------------------------------------------------- RoPE


def rope_reference(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the two halves of the last dim: (x₁c − x₂s, x₂c + x₁s)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope(x32: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """`rope_reference`; c, s are the half-width cos/sin tables. A 4-D (B, T, H, D) input
    comes back laid out as (B, H, T, D) (a transpose away), so attention reads heads
    without a copy."""
    return _RoPE.apply(x32, c, s)


class _RoPE(torch.autograd.Function):
    """(x₁, x₂) -> (x₁c − x₂s, x₂c + x₁s) over the two halves of the last dim; the backward
    is the inverse rotation (dy₁c + dy₂s, dy₂c − dy₁s). Two passes each way, where the
    autograd graph of cat/neg/mul/add makes about five."""

    @staticmethod
    def forward(ctx, x, c, s):  # type: ignore[override]
        ctx.save_for_backward(c, s)
        return _RoPE._rotate(x, c, s, 1.0)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        c, s = ctx.saved_tensors
        return _RoPE._rotate(dy, c, s, -1.0), None, None

    @staticmethod
    def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, sign: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """The rotation by `sign` (−1: its inverse), into `out` if given."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        if torch.compiler.is_compiling():  # inductor fuses the plain formula (and rejects out= into views)
            return torch.cat([x1 * c - sign * x2 * s, x2 * c + sign * x1 * s], dim=-1)
        dtype = torch.promote_types(x.dtype, c.dtype)
        if out is None and x.dim() == 4:  # (B, T, H, D) laid out as (B, H, T, D): attention reads heads without a copy
            B, T, H, D = x.shape
            out = torch.empty(B, H, T, D, dtype=dtype, device=x.device).transpose(1, 2)
        elif out is None:
            out = torch.empty(x.shape, dtype=dtype, device=x.device)
        o1, o2 = out[..., :half], out[..., half:]
        torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-sign)
        torch.mul(x2, c, out=o2).addcmul_(x1, s, value=sign)
        return out




# --------------------------------------------------------------------------- QK-norm then RoPE


def norm_rope_reference(x: torch.Tensor, gain: torch.Tensor, eps: float, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """RoPE(RMSNorm(x)·γ): the per-head QK-norm then rotate-half RoPE (SPEC §1.1)."""
    return rope_reference(rms_norm_reference(x, gain, eps), c, s)


def norm_rope(x: torch.Tensor, gain: torch.Tensor, eps: float, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """`norm_rope_reference(x, gain, eps, c, s)` in at least fp32, from x in any float dtype
    (a bf16 slice of the QKV product, say). x (B, T, h, D); gain (D,) shared by the heads;
    c, s the half-width cos/sin tables (B, T, 1, D/2). Comes back laid out as (B, h, T, D)
    a transpose away, as `rope`'s does."""
    if torch.compiler.is_compiling():  # inductor fuses the plain formula
        return norm_rope_reference(upcast(x), gain, eps, c, s)
    if _native_norm_rope_takes(x, gain, c, s):
        return _NativeNormRoPE.apply(x, gain, eps, c, s)
    return _NormRoPE.apply(x, gain, eps, c, s)


def _native_norm_rope_takes(x: torch.Tensor, gain: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> bool:
    """The compiled kernel runs norm_rope for CPU inputs in fp32 or bf16 with fp32 gain and
    tables of one layout (the model's case), when the compiled kernels are available."""
    return (x.device.type == "cpu" and x.dtype in _FUSED_DTYPES and x.stride(-1) == 1 and x.shape[-1] <= 1024
            and gain.dtype == c.dtype == s.dtype == torch.float32 and c.stride() == s.stride()
            and c.stride(-1) == 1 and native.available())


class _NormRoPE(torch.autograd.Function):
    """y = RoPE(n ⊙ γ) with n = x·r, r = (mean(x²) + eps)^-½ per head, in one function.

    The gain is shared by all heads, so it folds into the (B, T, 1, D/2) rotation tables
    (γ₁c, γ₂s, γ₂c, γ₁s): y₁ = n₁·γ₁c − n₂·γ₂s, y₂ = n₂·γ₂c + n₁·γ₁s, and the forward makes
    the cast, one reduction, n, and the rotation (the gain costs no pass). Backward, with
    u = RoPE⁻¹(dy) = (dy₁c + dy₂s, dy₂c − dy₁s): dγ = Σ_rows n ⊙ u, dn = γ ⊙ u,
    dx = r·(dn − n·⟨dn, n⟩/D), written in x's dtype. Run as `rms_norm` then `rope`, the
    norm's backward reads the rotation's transposed gradient and the gain costs a pass each
    way; measured on the 2-core CPU, one function made the whole step of the 10-layer
    d=128 SAN (T 256, bf16) 6% faster, the two models' steps alternating.
    """

    @staticmethod
    def forward(ctx, x, gain, eps, c, s):  # type: ignore[override]
        with torch.autocast(x.device.type, enabled=False):
            x32 = upcast(x)
            D = x.shape[-1]
            half = D // 2
            r = torch.linalg.vecdot(x32, x32).unsqueeze(-1).div_(D).add_(eps).rsqrt_()  # (B, T, h, 1)
            n = x32 * r
            g1, g2 = gain[:half], gain[half:]
            n1, n2 = n[..., :half], n[..., half:]
            B, T, h, _ = x.shape
            dtype = torch.promote_types(n.dtype, c.dtype)
            out = torch.empty(B, h, T, D, dtype=dtype, device=x.device).transpose(1, 2)
            o1, o2 = out[..., :half], out[..., half:]
            torch.mul(n1, c * g1, out=o1).addcmul_(n2, s * g2, value=-1.0)
            torch.mul(n2, c * g2, out=o2).addcmul_(n1, s * g1)
        ctx.save_for_backward(n, r, gain, c, s)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        n, r, gain, c, s = ctx.saved_tensors
        D = n.shape[-1]
        with torch.autocast(n.device.type, enabled=False):
            u = _RoPE._rotate(dy.to(n.dtype), c, s, -1.0, out=torch.empty_like(n))  # in n's layout
            dgain = None
            if ctx.needs_input_grad[1]:
                dgain = torch.linalg.vecdot(n.reshape(-1, D), u.reshape(-1, D), dim=0).to(gain.dtype)
            dn = u.mul_(gain)
            coef = torch.linalg.vecdot(dn, n).unsqueeze(-1).div_(-D)  # −⟨dn, n⟩/D
            dn.addcmul_(n, coef)
            dx = torch.mul(dn, r, out=torch.empty(n.shape, dtype=ctx.x_dtype, device=n.device))
        return dx, dgain, None, None, None




class _NativeNormRoPE(torch.autograd.Function):
    """`_NormRoPE`'s function by the compiled kernel (`csrc/norm_rope.c`): one pass over
    the activations each way, where the PyTorch kernel makes about seven forward and ten
    backward (its elementwise ops over (B, T, h, D/2) views). Saves x (which the QKV
    product's output already holds) and r, not the fp32 normalised n; dγ is summed in
    fixed chunks of rows, so it does not depend on the thread count."""

    @staticmethod
    def forward(ctx, x, gain, eps, c, s):  # type: ignore[override]
        B, T, h, D = x.shape
        out = torch.empty(B, h, T, D, dtype=torch.float32)
        r = torch.empty(B, T, h, dtype=torch.float32)
        gain = gain.contiguous()
        lib = native.library()
        _native_call(lib.sanlab_norm_rope_fwd, B, T, h, D, x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0),
                     x.stride(1), x.stride(2), gain.data_ptr(), eps, c.data_ptr(), s.data_ptr(), c.stride(0),
                     c.stride(1), out.data_ptr(), r.data_ptr(), torch.get_num_threads())
        ctx.save_for_backward(x, gain, r, c, s)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, gain, r, c, s = ctx.saved_tensors
        B, T, h, D = x.shape
        if dy.dtype != torch.float32 or dy.stride(-1) != 1:
            dy = dy.float().contiguous()
        dx = torch.empty(B, T, h, D, dtype=x.dtype)
        dgain = torch.empty(D, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        lib = native.library()
        _native_call(lib.sanlab_norm_rope_bwd, B, T, h, D, x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0),
                     x.stride(1), x.stride(2), gain.data_ptr(), r.data_ptr(), c.data_ptr(), s.data_ptr(), c.stride(0),
                     c.stride(1), dy.data_ptr(), dy.stride(0), dy.stride(2), dy.stride(1), dx.data_ptr(),
                     int(dx.dtype == torch.bfloat16), None if dgain is None else dgain.data_ptr(),
                     torch.get_num_threads())
        return dx, None if dgain is None else dgain.to(gain.dtype), None, None, None




# --------------------------------------------------------------------------- attention


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√D masked to `allowed`) v in fp32, GQA by repeating K/V heads.
    q (B, H, T, D); k, v (B, Hkv, T, D); allowed (B, 1, T, T) bool."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    scores = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


# On the CPU the explicit kernel (`_ExplicitAttention`) runs while the probabilities it
# keeps for the backward (`explicit_scores` values a layer, in v's dtype: bf16 under bf16
# autocast) stay under this many bytes; SDPA beyond. Measured on a 2-core AVX512-BF16 CPU
# (attention forward + backward, bf16 autocast, 2048 tokens a batch, H 8/4, D 32, the
# trainer's allocator settings; benchmarks/bench_attention.py): 3.5x faster than SDPA's
# CPU flash kernel at T = 64, 2.5x at 128, 1.8x at 256 and 512, 1.6x at 1024, 1.8x at
# 2048. Against fp64 (unit-scale q, k, v) its output and its k and v gradients are more
# accurate than SDPA's at every T; its q gradient's error is 1.09-1.14x SDPA's where P is
# kept in fp32 (T 64 to 1024) and 1.25x where only bf16 fits (T 2048, one row). At
# larger score scales it is below SDPA's; tests/test_model.py bounds each at 1.25x.
CPU_EXPLICIT_MAX_BYTES = 64 << 20
# Query rows per block of the explicit kernel: blocks above the diagonal are skipped, so
# a causal layer computes ~(T + chunk)/(2T) of the full score matrix. 64 was fastest, or
# within 9% of 32 and 128, at every T from 64 to 2048 on that CPU.
EXPLICIT_CHUNK = 64


def explicit_scores(batch: int, heads: int, seq_len: int) -> int:
    """Probabilities the explicit kernel keeps for the backward (one layer)."""
    chunk = min(EXPLICIT_CHUNK, seq_len)
    return batch * heads * seq_len * (seq_len + chunk) // 2


def unfused_cpu_backend(batch: int, heads: int, seq_len: int, low: torch.dtype | None) -> str:
    """The CPU kernel where the fused one cannot run: the explicit kernel while the
    probabilities it keeps fit (`explicit_keep`), SDPA beyond."""
    return "explicit" if explicit_keep(batch, heads, seq_len, low) is not None else "sdpa"


def explicit_keep(batch: int, heads: int, seq_len: int, low: torch.dtype | None) -> torch.dtype | None:
    """The dtype the explicit kernel keeps its probabilities in, or None if they do not fit
    `CPU_EXPLICIT_MAX_BYTES` (one layer): fp32 where that fits; else `low` (bf16 under
    bf16 autocast: half the memory; gradients within 1.25x of SDPA's error, tested)
    where that fits. fp32 first because on the CPU the backward's P ⊙ (dP − δ) runs 2x
    slower with a bf16 P (a mixed-dtype product), which costs more than the bf16 copy
    saves while memory is not the limit (measured: 5% of the T256 SAN step)."""
    n = explicit_scores(batch, heads, seq_len)
    if n * 4 <= CPU_EXPLICIT_MAX_BYTES:
        return torch.float32
    if low is not None and n * low.itemsize <= CPU_EXPLICIT_MAX_BYTES:
        return low
    return None



_compiled_flex = None


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: object) -> torch.Tensor:
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


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
    do: 3x faster on the CPU, with gradients within 1.25x of SDPA's error (tested; dQ's is
    1.09-1.25x on unit-scale q and k, dK's and dV's below SDPA's). dK and dV
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


# The fused kernel runs as torch custom ops (`sanlab::fused_attention` on q, k, v, and
# `sanlab::qkv_attention` on the raw QKV product with the QK-norm and RoPE applied inside),
# each with its compiled backward: FlopCounterMode sees them (`accounting` counts them as
# SDPA's full square), torch.compile traces around them, autograd calls the backward.
# The C entry points take every operand as (pointer, is-bf16, three strides); the QK-norm
# arguments are NULL for the plain op.
_NO_NORM = (None, None, 0.0, None, None, 0, 0)


def _spec(x: torch.Tensor, sb: int, sh: int, st: int, offset: int = 0) -> tuple[int, int, int, int, int]:
    """An operand as the C kernels read and write it: element (b, h, t, d) at
    x.data_ptr() + (offset + b·sb + h·sh + t·st + d) elements; fp32 or bf16."""
    return x.data_ptr() + offset * x.element_size(), int(x.dtype == torch.bfloat16), sb, sh, st


def _native_operand(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """A (B, h, T, D) tensor (d contiguous) as a C operand."""
    return _spec(x, x.stride(0), x.stride(1), x.stride(2))


def _bthd(B: int, T: int, h: int, D: int, dtype: torch.dtype) -> torch.Tensor:
    """A (B, h, T, D) tensor laid out as (B, T, h, D): what a head-merging reshape reads
    without a copy (attention's output before W_o; v's gradient, a slice of QKV's)."""
    return torch.empty(B, T, h, D, dtype=dtype).transpose(1, 2)


@torch.library.custom_op("sanlab::fused_attention", mutates_args=())
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
                    mode: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ/√D + M) v by the compiled CPU kernel (`csrc/attention.c`, products on
    AMX tiles in `csrc/attention_amx.c` where the CPU has them), with M causal and each
    row's keys limited to its document: row i of batch b sees keys [starts[b, i], i].

    q (B, H, T, D), k, v (B, Hkv, T, D): fp32 or bf16, any strides with the last one 1
    (v straight from the QKV product's slice, say); starts (B, T) int32; mode 0 for the
    fastest products this CPU has, 1 for the portable fp32 ones. Every product and
    reduction keeps fp32 accuracy (bf16 inputs widen exactly; on AMX a non-bf16 operand
    is split into two bf16 parts), so the result is `attention_reference`'s up to the
    order of sums (portable, ~1e-7 relative) or ~1e-5 (AMX). Per block of query rows
    the scores exist only in cache (no (T, T) tensor: memory O(T) at any length); the
    backward recomputes P from each row's log-sum-exp. Returns the output in v's dtype
    (B, H, T, D), laid out (B, T, H, D) so merging the heads is free; the same in fp32
    (kept for the backward); the log-sum-exp (B, H, T).
    """
    lib = native.library()
    B, H, T, D = q.shape
    y = _bthd(B, T, H, D, v.dtype)
    out = torch.empty(B, H, T, D, dtype=torch.float32)
    lse = torch.empty(B, H, T, dtype=torch.float32)
    _native_call(lib.sanlab_attn_fwd, B, H, k.shape[1], T, D, *_native_operand(q), *_native_operand(k),
                 *_native_operand(v), starts.data_ptr(), *_NO_NORM, None, None, out.data_ptr(), lse.data_ptr(),
                 *_native_operand(y), torch.get_num_threads(), mode)
    return y, out, lse


@fused_attention.register_fake
def _(q, k, v, starts, mode):  # noqa: ANN001, ANN202
    B, H, T, D = q.shape
    return (q.new_empty(B, T, H, D, dtype=v.dtype).transpose(1, 2), q.new_empty(B, H, T, D, dtype=torch.float32),
            q.new_empty(B, H, T, dtype=torch.float32))


@torch.library.custom_op("sanlab::fused_attention_backward", mutates_args=())
def fused_attention_backward(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             starts: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                             mode: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of `fused_attention` for its output's gradient dy, each in its input's
    dtype (dv laid out (B, T, Hkv, D), as v usually is)."""
    lib = native.library()
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    if dy.dtype not in _FUSED_DTYPES or dy.stride(-1) != 1:
        dy = dy.float().contiguous()
    dq = torch.empty(B, H, T, D, dtype=q.dtype)
    dk = torch.empty(B, Hkv, T, D, dtype=k.dtype)
    dv = _bthd(B, T, Hkv, D, v.dtype)
    _native_call(lib.sanlab_attn_bwd, B, H, Hkv, T, D, *_native_operand(q), *_native_operand(k), *_native_operand(v),
                 *_native_operand(dy), starts.data_ptr(), *_NO_NORM, None, None, None, None, out.data_ptr(),
                 lse.data_ptr(), *_native_operand(dq), *_native_operand(dk), *_native_operand(dv),
                 torch.get_num_threads(), mode)
    return dq, dk, dv


@fused_attention_backward.register_fake
def _(dy, q, k, v, starts, out, lse, mode):  # noqa: ANN001, ANN202
    B, Hkv, T, D = v.shape
    return torch.empty_like(q), torch.empty_like(k), v.new_empty(B, T, Hkv, D).transpose(1, 2)


def _fused_setup(ctx, inputs, output) -> None:  # noqa: ANN001
    q, k, v, starts, mode = inputs
    _, out, lse = output
    ctx.save_for_backward(q, k, v, starts, out, lse)
    ctx.mode = mode


def _fused_backward(ctx, dy, dout, dlse):  # noqa: ANN001, ANN202 - out and lse are not differentiated
    q, k, v, starts, out, lse = ctx.saved_tensors
    return (*fused_attention_backward(dy, q, k, v, starts, out, lse, ctx.mode), None, None)


torch.library.register_autograd("sanlab::fused_attention", _fused_backward, setup_context=_fused_setup)


def _qkv_specs(qkv: torch.Tensor, H: int, Hkv: int, D: int) -> list[tuple[int, int, int, int, int]]:
    """q, k and v inside a (B, T, (H + 2·Hkv)·D) QKV tensor: heads D apart, rows st apart."""
    sb, st = qkv.stride(0), qkv.stride(1)
    return [_spec(qkv, sb, D, st), _spec(qkv, sb, D, st, H * D), _spec(qkv, sb, D, st, (H + Hkv) * D)]


def _norm_args(gq: torch.Tensor, gk: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[int, int, float, int, int, int, int]:
    return gq.data_ptr(), gk.data_ptr(), eps, cos.data_ptr(), sin.data_ptr(), cos.stride(0), cos.stride(1)


@torch.library.custom_op("sanlab::qkv_attention", mutates_args=())
def qkv_attention(qkv: torch.Tensor, gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  starts: torch.Tensor, eps: float, heads: int, kv_heads: int, mode: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SoftmaxAttention's core from the QKV product: q and k through the per-head QK-norm
    (gains gq, gk; `norm_rope_reference`) and RoPE as the kernel reads them, then
    `fused_attention`, the output written with the heads merged.

    qkv (B, T, (H + 2·Hkv)·D) fp32 or bf16 with its last dim contiguous; gq, gk (D,)
    fp32; cos, sin (B, T, 1, D) fp32 (`rope_tables`; the first D/2 of each row used);
    starts (B, T) int32. Returns y (B, T, H·D) in qkv's dtype, the output in fp32
    (B, H, T, D), the log-sum-exp (B, H, T) and each q and k row's 1/RMS, (B, T, H) and
    (B, T, Hkv) — the last four kept for the backward. One pass over q, k and v each way
    instead of the norm's, RoPE's, the casts' and the heads' copies.
    """
    lib = native.library()
    B, T, W = qkv.shape
    D = W // (heads + 2 * kv_heads)
    y = torch.empty(B, T, heads * D, dtype=qkv.dtype)
    out = torch.empty(B, heads, T, D, dtype=torch.float32)
    lse = torch.empty(B, heads, T, dtype=torch.float32)
    rq = torch.empty(B, T, heads, dtype=torch.float32)
    rk = torch.empty(B, T, kv_heads, dtype=torch.float32)
    _native_call(lib.sanlab_attn_fwd, B, heads, kv_heads, T, D, *[a for x in _qkv_specs(qkv, heads, kv_heads, D)
                                                                   for a in x],
                 starts.data_ptr(), *_norm_args(gq, gk, eps, cos, sin), rq.data_ptr(), rk.data_ptr(), out.data_ptr(),
                 lse.data_ptr(), *_spec(y, y.stride(0), D, y.stride(1)), torch.get_num_threads(), mode)
    return y, out, lse, rq, rk


@qkv_attention.register_fake
def _(qkv, gq, gk, cos, sin, starts, eps, heads, kv_heads, mode):  # noqa: ANN001, ANN202
    B, T, W = qkv.shape
    D = W // (heads + 2 * kv_heads)
    f32 = torch.float32
    return (qkv.new_empty(B, T, heads * D), qkv.new_empty(B, heads, T, D, dtype=f32),
            qkv.new_empty(B, heads, T, dtype=f32), qkv.new_empty(B, T, heads, dtype=f32),
            qkv.new_empty(B, T, kv_heads, dtype=f32))


@torch.library.custom_op("sanlab::qkv_attention_backward", mutates_args=())
def qkv_attention_backward(dy: torch.Tensor, qkv: torch.Tensor, gq: torch.Tensor, gk: torch.Tensor,
                           cos: torch.Tensor, sin: torch.Tensor, starts: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, rq: torch.Tensor, rk: torch.Tensor, eps: float, heads: int,
                           kv_heads: int, mode: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dqkv (in qkv's dtype and shape), dgq, dgk of `qkv_attention` for y's gradient dy."""
    lib = native.library()
    B, T, W = qkv.shape
    D = W // (heads + 2 * kv_heads)
    if dy.dtype not in _FUSED_DTYPES or dy.stride(-1) != 1:
        dy = dy.float().contiguous()
    dqkv = torch.empty(B, T, W, dtype=qkv.dtype)
    dgq = torch.empty(D, dtype=torch.float32)
    dgk = torch.empty(D, dtype=torch.float32)
    _native_call(lib.sanlab_attn_bwd, B, heads, kv_heads, T, D,
                 *[a for x in _qkv_specs(qkv, heads, kv_heads, D) for a in x],
                 *_spec(dy, dy.stride(0), D, dy.stride(1)), starts.data_ptr(), *_norm_args(gq, gk, eps, cos, sin),
                 rq.data_ptr(), rk.data_ptr(), dgq.data_ptr(), dgk.data_ptr(), out.data_ptr(), lse.data_ptr(),
                 *[a for x in _qkv_specs(dqkv, heads, kv_heads, D) for a in x], torch.get_num_threads(), mode)
    return dqkv, dgq, dgk


@qkv_attention_backward.register_fake
def _(dy, qkv, gq, gk, cos, sin, starts, out, lse, rq, rk, eps, heads, kv_heads, mode):  # noqa: ANN001, ANN202
    return torch.empty_like(qkv), torch.empty_like(gq), torch.empty_like(gk)


def _qkv_setup(ctx, inputs, output) -> None:  # noqa: ANN001
    qkv, gq, gk, cos, sin, starts, eps, heads, kv_heads, mode = inputs
    _, out, lse, rq, rk = output
    ctx.save_for_backward(qkv, gq, gk, cos, sin, starts, out, lse, rq, rk)
    ctx.args = (eps, heads, kv_heads, mode)


def _qkv_backward(ctx, dy, *_):  # noqa: ANN001, ANN002, ANN202 - only y is differentiated
    qkv, gq, gk, cos, sin, starts, out, lse, rq, rk = ctx.saved_tensors
    dqkv, dgq, dgk = qkv_attention_backward(dy, qkv, gq, gk, cos, sin, starts, out, lse, rq, rk, *ctx.args)
    return dqkv, dgq.to(gq.dtype), dgk.to(gk.dtype), None, None, None, None, None, None, None


torch.library.register_autograd("sanlab::qkv_attention", _qkv_backward, setup_context=_qkv_setup)


_FUSED_DTYPES = (torch.float32, torch.bfloat16)
# The fused kernel's products may run on AMX tiles where the CPU and the build have them
# (`csrc/attention_amx.c`); False (or SANLAB_AMX=0 in the environment) keeps them on the
# portable fp32 path, which the tests compare it against.
FUSED_AMX = True


def fused_products(low_precision: bool) -> int:
    """The fused kernel's `mode`: 0, the fastest products this CPU has (AMX's split bf16
    products, ~1e-5 relative); 1, the portable fp32 ones (~1e-7). As PyTorch does for fp32
    matmuls, an fp32 computation gets fp32 arithmetic unless `torch.set_float32_matmul_precision`
    allows less than "highest"; a low-precision one (bf16 autocast) accepts bf16 products,
    and the split ones are far more accurate than those."""
    if not FUSED_AMX or os.environ.get("SANLAB_AMX", "1") == "0":
        return 1
    return 0 if low_precision or torch.get_float32_matmul_precision() != "highest" else 1


def _fused_mode(*inputs: torch.Tensor) -> int:
    return fused_products(any(t.dtype == torch.bfloat16 for t in inputs))


def _native_call(fn, *args) -> None:  # noqa: ANN001
    status = fn(*args)
    if status == 2:
        raise MemoryError(f"{fn.__name__}: out of memory for its buffers")
    if status != 0:
        raise RuntimeError(f"{fn.__name__}: the kernel refused its arguments (status {status})")


def fused_supported(ctx: AttentionContext, head_dim: int, *tensors: torch.Tensor) -> bool:
    """Whether the fused kernel takes these inputs: its backend, CPU tensors in fp32 or
    bf16 with the last dim contiguous, a head dim up to 1024, and documents that are runs
    of their segment id (`ctx.row_starts`)."""
    return (ctx.backend == "fused" and head_dim <= 1024
            and all(t.device.type == "cpu" and t.dtype in _FUSED_DTYPES for t in tensors)
            and ctx.row_starts is not None)


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return fused_attention(q, k, v, ctx.row_starts, _fused_mode(q, k, v))[0]


def fused_qkv_attention(qkv: torch.Tensor, heads: int, kv_heads: int, gq: torch.Tensor, gk: torch.Tensor, eps: float,
                        ctx: AttentionContext, pattern_hook: HookPoint | None = None) -> torch.Tensor | None:
    """Softmax attention from the QKV product with the per-head QK-norm (gains gq, gk; eps)
    then RoPE on q and k, in one op (`qkv_attention`): (B, T, (H + 2·Hkv)·D) -> (B, T, H·D),
    the heads merged, in qkv's dtype (what W_o reads). None where the fused kernel does not
    take it (`fused_supported`, fp32 gains, an even head dim, no pattern hook to feed):
    the caller then runs `norm_rope` and `attend`, the same function in several ops."""
    D = qkv.shape[-1] // (heads + 2 * kv_heads)
    if ((pattern_hook is not None and pattern_hook.active) or D % 2 or qkv.stride(-1) != 1
            or not fused_supported(ctx, D, qkv) or not gq.dtype == gk.dtype == ctx.cos.dtype == torch.float32):
        return None
    return qkv_attention(qkv, gq.contiguous(), gk.contiguous(), ctx.cos.contiguous(), ctx.sin.contiguous(),
                         ctx.row_starts, eps, heads, kv_heads, _fused_mode(qkv))[0]


def _explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext, pattern_hook: HookPoint | None
) -> torch.Tensor:
    """The explicit kernel; with a pattern hook, plain autograd ops that materialise the
    whole (B, H, T, T) probability tensor for the hook (same arithmetic, fp32 scores)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # keep the scores in fp32 under autocast
        bias = ctx.additive_mask(dt)
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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: AttentionContext,
    pattern_hook: HookPoint | None = None,
) -> torch.Tensor:
    """Document-masked causal attention with GQA.

    q: (B, H, T, D); k, v: (B, Hkv, T, D) -> (B, H, T, D) in v's dtype. q and k may be in any
    float dtype (a mixer passes them as it computed them, e.g. fp32 after norm and RoPE):
    each backend casts what it needs, so mixers never branch on the backend.
    `ctx` is a `sanlab.model.layers.AttentionContext` (backend and document masks).
    When `pattern_hook` has a hook attached, the probabilities are materialised by the
    explicit kernel so analysis can capture `A` (B, H, T, T); otherwise `ctx.backend` runs.
    """
    if pattern_hook is not None and pattern_hook.active:
        return _explicit(q, k, v, ctx, pattern_hook)
    backend = ctx.backend
    if backend == "fused":
        if fused_supported(ctx, q.shape[-1], q, k, v):
            return _fused(q, k, v, ctx)
        # fp64 (property tests), fp16, or segment ids that repeat after another id
        low = v.dtype if v.dtype.itemsize == 2 else None
        backend = unfused_cpu_backend(q.shape[0], q.shape[1], q.shape[2], low)
    if backend == "explicit":
        return _explicit(q, k, v, ctx, None)
    # SDPA and FlexAttention take q and k in v's dtype; the explicit kernel computes its
    # scores in fp32 from q and k as given (callers may pass them unrounded, in fp32).
    q, k = q.to(v.dtype), k.to(v.dtype)
    if backend == "flex":
        return _flex(q, k, v, ctx.block_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.dense_mask, enable_gqa=q.shape[1] != k.shape[1])




# --------------------------------------------------------------------------- gated residual


def gated_residual_reference(x: torch.Tensor, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x + σ(g) · h (SPEC §1.1's gated residual)."""
    return x + torch.sigmoid(g) * h


def gated_residual(x: torch.Tensor, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if (_native_ready(h) and x.dtype == g.dtype == torch.float32 and h.dtype in _FUSED_DTYPES
            and h.is_contiguous() and g.numel() == 1):
        return _NativeGatedResidual.apply(x, h, g)
    return _GatedResidual.apply(x, h, g)


class _GatedResidual(torch.autograd.Function):
    """x + σ(g)·h in one pass (x the fp32 stream, h a sublayer's update, often bf16), with
    dx = dy, dh = σ(g)·dy, dg = σ'(g)·Σ dy⊙h: two passes, where autograd through the
    cast, the product and the promoting add makes four each way. (With a bf16 h the
    gate's gradient sums bf16 row dot products in fp32; autograd's sums in bf16.)"""

    @staticmethod
    def forward(ctx, x, h, g):  # type: ignore[override]
        s = torch.sigmoid(g)
        ctx.save_for_backward(h, s)
        return torch.addcmul(x, h, s.to(torch.promote_types(x.dtype, h.dtype)))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        h, s = ctx.saved_tensors
        # dh = σ·dy written in h's dtype in one pass; then dg = σ'·⟨dy, h⟩ = (1 − σ)·⟨dh, h⟩
        dh = torch.mul(dy, s, out=torch.empty(h.shape, dtype=h.dtype, device=h.device))
        rows = (-1, h.shape[-1])  # (row-wise: a flat bf16 dot product is ~10x slower on the CPU)
        dg = (1 - s) * torch.linalg.vecdot(dh.reshape(rows), h.reshape(rows)).sum(dtype=s.dtype)
        return dy, dh, dg




class _NativeGatedResidual(_GatedResidual):
    """`_GatedResidual` (its forward) with the backward by the compiled kernel
    (`csrc/norms.c`): dh and the gate's Σ dy⊙h in one pass (summed in fp32 from the
    unrounded σ·dy, in fixed chunks)."""

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        h, s = ctx.saved_tensors
        if dy.dtype != torch.float32 or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dh = torch.empty(h.shape, dtype=h.dtype)
        dg = torch.empty((), dtype=torch.float32)
        _native_call(native.library().sanlab_gated_residual_bwd, h.numel(), h.shape[-1], dy.data_ptr(), h.data_ptr(),
                     int(h.dtype == torch.bfloat16), float(s), dh.data_ptr(), dg.data_ptr(), torch.get_num_threads())
        return dy, dh, dg.reshape(s.shape).to(s.dtype)




# --------------------------------------------------------------------------- SiLU ⊙ up


def silu_gate_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """[gate | up] -> SiLU(gate) ⊙ up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_gate(gate_up: torch.Tensor) -> torch.Tensor:
    return _SiLUGate.apply(gate_up)


class _SiLUGate(torch.autograd.Function):
    """[gate | up] (…, 2F) -> SiLU(gate) ⊙ up (…, F), whose backward writes d gate and d up
    straight into the two halves of one (…, 2F) gradient (autograd through chunk/silu/mul
    would allocate both and concatenate them: one more pass over the widest activation).
    d up = dy ⊙ SiLU(gate), d gate = SiLU'(gate) ⊙ (dy ⊙ up)."""

    @staticmethod
    def forward(ctx, gate_up):  # type: ignore[override]
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(gate, up, act)
        return act * up

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        gate, up, act = ctx.saved_tensors
        if torch.compiler.is_compiling():  # (inductor fuses this; it rejects out= into views)
            return torch.cat([torch.ops.aten.silu_backward(dy * up, gate), dy * act], dim=-1)
        n = gate.shape[-1]
        grad = torch.empty(*gate.shape[:-1], 2 * n, dtype=gate.dtype, device=gate.device)
        torch.mul(dy, act, out=grad[..., n:])
        torch.ops.aten.silu_backward.grad_input(dy * up, gate, grad_input=grad[..., :n])
        return grad




# --------------------------------------------------------------------------- fused head + loss
# (`lm_loss` below is its reference formula: the same loss from logits already at hand)


def _loss_chunk_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    """Rows per chunk of the fused head + loss. On the CPU ~2M logits (8 MB in fp32): the
    passes over a chunk stay in the last-level cache, and the head's matmuls are large
    enough to run near peak (at V=2048, 1024-row chunks were ~5% faster than 256-row
    ones on a 2-core CPU). On accelerators ~128M (512 MB), which bounds the fp32
    temporaries (a 16×2048-token micro-batch at V=16,384 would otherwise need 2 GB)
    while keeping the number of kernel launches small."""
    budget = 1 << 21 if device.type == "cpu" else 1 << 27
    return max(1, min(n_rows, budget // vocab))


def _dw_group_rows(n_rows: int, vocab: int, chunk: int, device: torch.device) -> int:
    """Rows per product of the head's weight gradient dW = Σ gᵀ x: a whole number of loss
    chunks. Each product's (V, d) result is added to the fp32 dW in full, so per chunk
    (128 rows at V=16,384) that addition streamed dW through memory 32 times a
    4096-token step. On the CPU the chunks' gradients are kept for ~16M logits (32 MB in
    bf16) and multiplied together: the d=256, 4-layer, V=16,384 step got 8% faster
    (measured, the two versions' steps alternating). On accelerators each chunk is
    already that large."""
    if device.type != "cpu":
        return chunk
    return max(chunk, min(n_rows, ((1 << 24) // vocab) // chunk * chunk))


# below this a target's softmax probability is not a normal fp32 number with full
# precision to spare (the smallest normal is ~1.2e-38), so its log is not used for lse
_P_TARGET_TINY = 1e-30


def _lse_from_target(logits: torch.Tensor, x_t: torch.Tensor, p_t: torch.Tensor, sync_free: bool) -> torch.Tensor:
    """Each row's logsumexp from its target's logit and softmax probability,
    lse = x_t − log p_t, and from the logits themselves where p_t is below
    `_P_TARGET_TINY`. On the CPU only those rows are recomputed (finding them is free);
    with `sync_free` (accelerators) every row's logsumexp is computed and kept where
    needed, so the host never waits for the device."""
    lse = x_t - p_t.log()
    tiny = p_t < _P_TARGET_TINY
    if sync_free:
        return torch.where(tiny, torch.logsumexp(logits, dim=-1), lse)
    if bool(tiny.any()):
        lse[tiny] = torch.logsumexp(logits[tiny], dim=-1)
    return lse


class _HeadCrossEntropyZLoss(torch.autograd.Function):
    """Σ_i w_i·(CE_i + c·lse_i²) over logits = x Wᵀ, chunk by chunk, gradients included.

    Autograd through head → logsumexp → gather streams the (N, V) logits and several
    fp32 temporaries of that size through memory. Here each chunk of rows is projected,
    reduced and turned into its gradient while it is in cache, and only dx (N, d) and
    dW (V, d) are kept for the backward, which scales them by the incoming gradient:
    d/dlogits [w(lse − x_t) + c·w·lse²] = w·p·(1 + 2c·lse) − w·onehot(t), p = softmax.
    The matmuls run in x's dtype (bf16 under autocast, as the unfused head's), every
    reduction in at least fp32. Returns (loss, cross-entropy), the second not differentiable.
    """

    @staticmethod
    def forward(ctx, x, weight, targets, weights, c, grad_enabled):  # type: ignore[override]
        dt = torch.promote_types(x.dtype, torch.float32)
        w_x = weight.to(x.dtype)
        # (grad mode is off inside forward: the caller says whether a backward can follow)
        grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        N, V = x.shape[0], weight.shape[0]
        ce = torch.zeros((), dtype=dt, device=x.device)
        z = torch.zeros((), dtype=dt, device=x.device)
        step = _loss_chunk_rows(N, V, x.device)
        if grad:
            dx = torch.empty_like(x)
            dw = torch.zeros(weight.shape, dtype=dt, device=x.device)
            group = _dw_group_rows(N, V, step, x.device)
            g_rows = torch.empty(min(group, N), V, dtype=x.dtype, device=x.device)  # the group's chunk gradients
        for i in range(0, N, step):
            j = slice(i, i + step)
            logits = (x[j] @ w_x.t()).to(dt)  # (n, V)
            t, w = targets[j, None], weights[j]
            # softmax is one fused pass per row and p is what the gradient needs;
            # lse = x_t − log p_t is exact in fp32 while p_t is a normal number. Rows whose
            # p_t is too small for that (a target logit ~87 below the row's top) take
            # logsumexp over their logits instead.
            x_t = logits.gather(-1, t).squeeze(-1)
            p = torch.softmax(logits, dim=-1)
            lse = _lse_from_target(logits, x_t, p.gather(-1, t).squeeze(-1), sync_free=x.device.type != "cpu")
            del logits
            ce += ((lse - x_t) * w).sum()
            z += (lse.square() * w).sum()
            if grad:
                # w(1 + 2c·lse)·(p − onehot/(1 + 2c·lse)): the target's subtraction in fp32
                # (it cancels when p_t ≈ 1), the scaling in place, then one cast
                scale = 1.0 + 2.0 * c * lse
                p.scatter_add_(-1, t, -(1.0 / scale)[:, None]).mul_((w * scale)[:, None])
                g0 = i // group * group  # first row of this chunk's group
                g = g_rows[i - g0:i - g0 + p.shape[0]]
                g.copy_(p)
                dx[j] = g @ w_x
                last = min(N, g0 + group)
                if i + p.shape[0] == last:  # the group is complete: its dW product
                    dw += g_rows[:last - g0].t() @ x[g0:last]
        if grad:
            ctx.save_for_backward(dx, dw)
        ctx.mark_non_differentiable(ce)
        return ce + c * z, ce

    @staticmethod
    def backward(ctx, g_loss, g_ce):  # type: ignore[override]
        dx, dw = ctx.saved_tensors
        return dx * g_loss.to(dx.dtype), dw * g_loss, None, None, None, None


def head_loss(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, z_loss: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """`lm_loss(x @ weightᵀ, targets, loss_mask, z_loss)` without the logits.

    x (B, T, d) final hidden states, weight (V, d) the (tied) head. Under autocast the
    head matmul runs in the autocast dtype, as `F.linear` would.
    """
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    mask = loss_mask.reshape(-1).to(torch.promote_types(x.dtype, torch.float32))
    weights = mask / mask.sum().clamp_min(1.0)
    with torch.autocast(dev, enabled=False):
        return _HeadCrossEntropyZLoss.apply(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1), weights, z_loss,
                                            torch.is_grad_enabled())



def lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, z_loss: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean CE over `loss_mask` tokens plus z_loss · logsumexp(logits)² (SPEC §1.1).

    logits (B, T, V), targets (B, T), loss_mask (B, T) bool. Returns (loss to
    optimise, cross-entropy alone). Targets outside the mask (document boundaries,
    padding) contribute nothing. Training uses the fused `head_loss` (through
    `LM.forward(..., targets=...)`); this is the same loss for logits already at hand.
    """
    logits32 = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    mask = loss_mask.reshape(-1).to(logits32.dtype)
    weights = mask / mask.sum().clamp_min(1.0)
    flat = logits32.reshape(-1, logits32.shape[-1])
    lse = torch.logsumexp(flat, dim=-1)
    ce = ((lse - flat.gather(-1, targets.reshape(-1, 1)).squeeze(-1)) * weights).sum()
    return ce + z_loss * (lse.square() * weights).sum(), ce
