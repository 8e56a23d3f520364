"""The norm kernels, each beside the plain formula it is tested against: RMS norm, and the
per-head QK-norm then RoPE in one function (`norm_rope`), in PyTorch and compiled
(`csrc/norms.c`, `csrc/norm_rope.c`, used on the CPU where they build).

As in `sanlab.model.kernels`: each computes exactly its `*_reference` formula with fewer
passes over the activations, and the tests compare the two (values and gradients).
"""

from __future__ import annotations

import torch

from sanlab.model import native
from sanlab.model.kernels import NATIVE_DTYPES, rope_reference, rope_rotate, upcast


# --------------------------------------------------------------------------- RMS norm


def rms_norm_reference(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """x · (mean(x²) + eps)^-½ · gain over the last dim (the formula of `rms_norm`)."""
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * gain


def rms_norm(x32: torch.Tensor, gain: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """`rms_norm_reference(x32, gain, eps)` written in `out_dtype` (x32 at least fp32)."""
    if (native.ready(x32) and x32.dtype == gain.dtype == torch.float32 and x32.is_contiguous()
            and out_dtype in NATIVE_DTYPES):
        return _NativeRMSNorm.apply(x32, gain, eps, out_dtype)
    return _RMSNorm.apply(x32, gain, eps, out_dtype)


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
        native.call(native.library().sanlab_rms_norm_fwd, native.RMSNormArgs(
            n=x.numel() // d, d=d, x=x.data_ptr(), gain=gain.data_ptr(), eps=eps, r=r.data_ptr(), out=out.data_ptr(),
            out_bf16=int(out_dtype == torch.bfloat16), nthreads=torch.get_num_threads()))
        ctx.save_for_backward(x, gain, r)
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, gain, r = ctx.saved_tensors
        d = x.shape[-1]
        if dy.dtype not in NATIVE_DTYPES or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dx = torch.empty_like(x)
        dgain = torch.empty(d, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        native.call(native.library().sanlab_rms_norm_bwd, native.RMSNormArgs(
            n=x.numel() // d, d=d, x=x.data_ptr(), gain=gain.data_ptr(), r=r.data_ptr(), dy=dy.data_ptr(),
            dy_bf16=int(dy.dtype == torch.bfloat16), dx=dx.data_ptr(),
            dgain=None if dgain is None else dgain.data_ptr(), nthreads=torch.get_num_threads()))
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
    return (x.device.type == "cpu" and x.dtype in NATIVE_DTYPES and x.stride(-1) == 1 and x.shape[-1] <= 1024
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
    way (one function is faster: benchmarks/README.md).
    """

    @staticmethod
    def forward(ctx, x, gain, eps, c, s):  # type: ignore[override]
        with torch.autocast(x.device.type, enabled=False):
            n, r = qk_normalise(x, eps)
            B, T, h, D = x.shape
            out = torch.empty(B, h, T, D, dtype=torch.promote_types(n.dtype, c.dtype), device=x.device).transpose(1, 2)
            gained_rope(n, gain, c, s, out)
        ctx.save_for_backward(n, r, gain, c, s)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        n, r, gain, c, s = ctx.saved_tensors
        D = n.shape[-1]
        with torch.autocast(n.device.type, enabled=False):
            u = rope_rotate(dy.to(n.dtype), c, s, -1.0, out=torch.empty_like(n))  # in n's layout
            dgain = None
            if ctx.needs_input_grad[1]:
                dgain = torch.linalg.vecdot(n.reshape(-1, D), u.reshape(-1, D), dim=0).to(gain.dtype)
            dx = qk_normalise_backward(n, r, u.mul_(gain), ctx.x_dtype)
        return dx, dgain, None, None, None


def qk_normalise(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_NormRoPE`'s norm over the last dim: n = x·r in fp32 (at least), r = (mean(x²) + eps)^-½."""
    x32 = upcast(x)
    r = torch.linalg.vecdot(x32, x32).unsqueeze(-1).div_(x.shape[-1]).add_(eps).rsqrt_()
    return x32 * r, r


def gained_rope(n: torch.Tensor, gain: torch.Tensor, c: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """out = RoPE(n ⊙ γ) with the gain folded into the half-width tables (`_NormRoPE`):
    y₁ = n₁·γ₁c − n₂·γ₂s, y₂ = n₂·γ₂c + n₁·γ₁s; gain and tables broadcast against n."""
    half = n.shape[-1] // 2
    g1, g2 = gain[..., :half], gain[..., half:]
    n1, n2 = n[..., :half], n[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(n1, c * g1, out=o1).addcmul_(n2, s * g2, value=-1.0)
    torch.mul(n2, c * g2, out=o2).addcmul_(n1, s * g1)


def qk_normalise_backward(n: torch.Tensor, r: torch.Tensor, dn: torch.Tensor, x_dtype: torch.dtype) -> torch.Tensor:
    """dx = r·(dn − n·⟨dn, n⟩/D) in x's dtype, from dn = ∂L/∂n (overwritten)."""
    coef = torch.linalg.vecdot(dn, n).unsqueeze(-1).div_(-n.shape[-1])  # −⟨dn, n⟩/D
    dn.addcmul_(n, coef)
    return torch.mul(dn, r, out=torch.empty(n.shape, dtype=x_dtype, device=n.device))


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
        native.call(native.library().sanlab_norm_rope_fwd, native.NormRoPEArgs(
            B=B, T=T, h=h, D=D, x=native.tensor(x, sb=x.stride(0), sh=x.stride(2), st=x.stride(1)),
            gain=gain.data_ptr(), eps=eps, cos=c.data_ptr(), sin=s.data_ptr(), csb=c.stride(0), cst=c.stride(1),
            r=r.data_ptr(), out=out.data_ptr(), nthreads=torch.get_num_threads()))
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
        native.call(native.library().sanlab_norm_rope_bwd, native.NormRoPEArgs(
            B=B, T=T, h=h, D=D, x=native.tensor(x, sb=x.stride(0), sh=x.stride(2), st=x.stride(1)),
            gain=gain.data_ptr(), cos=c.data_ptr(), sin=s.data_ptr(), csb=c.stride(0), cst=c.stride(1),
            r=r.data_ptr(), dy=native.tensor(dy, sb=dy.stride(0), sh=dy.stride(2), st=dy.stride(1)),
            dx=native.tensor(dx, sb=dx.stride(0), sh=dx.stride(2), st=dx.stride(1)),
            dgain=None if dgain is None else dgain.data_ptr(), nthreads=torch.get_num_threads()))
        return dx, None if dgain is None else dgain.to(gain.dtype), None, None, None
