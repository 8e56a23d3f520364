"""Hand-written autograd kernels, each beside the plain formula it is tested against:
RoPE, the gated residual and SiLU ⊙ up (the norms are in `sanlab.model.norms`, attention
in `sanlab.model.attention`, the fused head + loss in `sanlab.model.loss`).

Every kernel here computes exactly its reference formula (`*_reference`, plain PyTorch,
autograd's backward) with fewer passes over the activations or less memory; the tests
compare each one with its reference (values and gradients, fp32 and bf16 autocast).
Model code calls the public wrappers (`rope`, `gated_residual`, `silu_gate`); a variant is
written in plain PyTorch and may opt into any of them. Under `torch.compile` the kernels
fall back to their plain formulas where inductor needs them to (it rejects `out=` into
views).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sanlab.model import native


# --------------------------------------------------------------------------- dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (norms and RoPE run in fp32, SPEC §1.1); fp64 stays fp64 so
    property tests can be exact."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# The dtypes the compiled kernels (`sanlab.model.native`) read and write.
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


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


def rope_rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, sign: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE's rotation of x by `sign` (−1: its inverse), into `out` if given (`_RoPE`)."""
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


class _RoPE(torch.autograd.Function):
    """(x₁, x₂) -> (x₁c − x₂s, x₂c + x₁s) over the two halves of the last dim; the backward
    is the inverse rotation (dy₁c + dy₂s, dy₂c − dy₁s). Two passes each way, where the
    autograd graph of cat/neg/mul/add makes about five."""

    @staticmethod
    def forward(ctx, x, c, s):  # type: ignore[override]
        ctx.save_for_backward(c, s)
        return rope_rotate(x, c, s, 1.0)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        c, s = ctx.saved_tensors
        return rope_rotate(dy, c, s, -1.0), None, None


# --------------------------------------------------------------------------- gated residual


def gated_residual_reference(x: torch.Tensor, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x + σ(g) · h (SPEC §1.1's gated residual)."""
    return x + torch.sigmoid(g) * h


def gated_residual(x: torch.Tensor, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if (native.ready(h) and x.dtype == g.dtype == torch.float32 and h.dtype in NATIVE_DTYPES
            and h.is_contiguous() and x.is_contiguous() and x.shape == h.shape and g.numel() == 1):
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
        rows = (-1, h.shape[-1])  # (row-wise: a flat bf16 dot product is slower on the CPU, benchmarks/README.md)
        dg = (1 - s) * torch.linalg.vecdot(dh.reshape(rows), h.reshape(rows)).sum(dtype=s.dtype)
        return dy, dh, dg


def native_gated_residual(x: torch.Tensor, h: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """x + σ·h by the compiled kernel (`csrc/norms.c`): `_GatedResidual`'s addcmul bit for
    bit in one pass, without its fp32 copy of a bf16 h. x fp32 and h contiguous, of one
    shape; sigmas (G,) fp32, one σ for each of G equal groups of x's leading dimension."""
    out = torch.empty_like(x)
    sig = sigmas.detach().float().contiguous()
    native.call(native.library().sanlab_gated_residual_fwd, native.GatedResidualArgs(
        count=h.numel(), d=h.shape[-1], h=h.data_ptr(), h_bf16=int(h.dtype == torch.bfloat16), x=x.data_ptr(),
        out=out.data_ptr(), nthreads=torch.get_num_threads(), group_count=h.numel() // sig.numel(),
        sigmas=sig.data_ptr()))
    return out


class _NativeGatedResidual(_GatedResidual):
    """`_GatedResidual` by the compiled kernels (`csrc/norms.c`): the forward in one pass
    (`native_gated_residual`), the backward's dh and the gate's Σ dy⊙h in one pass (summed
    in fp32 from the unrounded σ·dy, in fixed chunks)."""

    @staticmethod
    def forward(ctx, x, h, g):  # type: ignore[override]
        s = torch.sigmoid(g)
        ctx.save_for_backward(h, s)
        return native_gated_residual(x, h, s.reshape(1))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        h, s = ctx.saved_tensors
        if dy.dtype != torch.float32 or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dh = torch.empty(h.shape, dtype=h.dtype)
        dg = torch.empty((), dtype=torch.float32)
        native.call(native.library().sanlab_gated_residual_bwd, native.GatedResidualArgs(
            count=h.numel(), d=h.shape[-1], dy=dy.data_ptr(), h=h.data_ptr(), h_bf16=int(h.dtype == torch.bfloat16),
            sigma=float(s), dh=dh.data_ptr(), dg=dg.data_ptr(), nthreads=torch.get_num_threads()))
        return dy, dh, dg.reshape(s.shape).to(s.dtype)


# --------------------------------------------------------------------------- SiLU ⊙ up


def silu_gate_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """[gate | up] -> SiLU(gate) ⊙ up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_gate(gate_up: torch.Tensor) -> torch.Tensor:
    if native.ready(gate_up) and gate_up.dtype in NATIVE_DTYPES and gate_up.is_contiguous():
        return _NativeSiLUGate.apply(gate_up)
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
        return _silu_gate_backward(*ctx.saved_tensors, dy)


def _silu_gate_backward(gate: torch.Tensor, up: torch.Tensor, act: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """[d gate | d up] by torch's formulas, written into the two halves of one gradient."""
    if torch.compiler.is_compiling():  # (inductor fuses this; it rejects out= into views)
        return torch.cat([torch.ops.aten.silu_backward(dy * up, gate), dy * act], dim=-1)
    n = gate.shape[-1]
    grad = torch.empty(*gate.shape[:-1], 2 * n, dtype=gate.dtype, device=gate.device)
    torch.mul(dy, act, out=grad[..., n:])
    torch.ops.aten.silu_backward.grad_input(dy * up, gate, grad_input=grad[..., :n])
    return grad


# floats in one of torch's CPU vectors, by the capability its kernels dispatch to
_TORCH_VECTOR_FLOATS = {"AVX512": 16, "AVX2": 8}


def _silu_gate_args(gate_up: torch.Tensor, **ptrs: torch.Tensor) -> native.SiLUGateArgs:
    """The kernel's arguments. `vec_cols`: the values of a row that torch's elementwise loop
    runs by vector blocks (two vectors a step; a bf16 vector holds twice the floats), the
    rest by its scalar code (the C library's expf); on another CPU, the whole row."""
    F, bf16 = gate_up.shape[-1] // 2, gate_up.dtype == torch.bfloat16
    floats = _TORCH_VECTOR_FLOATS.get(torch.backends.cpu.get_cpu_capability())
    vec_cols = F if floats is None else F - F % (2 * floats * (2 if bf16 else 1))
    return native.SiLUGateArgs(rows=gate_up.numel() // max(2 * F, 1), F=F, gate_up=gate_up.data_ptr(), bf16=int(bf16),
                               nthreads=torch.get_num_threads(), vec_cols=vec_cols,
                               **{k: v.data_ptr() for k, v in ptrs.items()})


class _NativeSiLUGate(torch.autograd.Function):
    """`_SiLUGate` by the compiled kernels (`csrc/swiglu.c`): one pass each way, the same
    bits where torch's exp is SLEEF's u10 (x86 with AVX2 or AVX-512; tests/test_native.py
    compares them bit for bit there). The forward keeps only gate_up (the backward computes
    SiLU(gate) again), a third less memory held than the torch formulas' gate, up and act.
    The torch formulas' intermediates were strided views of gate_up, which torch's
    elementwise kernels read and write several times slower than contiguous rows: the
    demo's iso-depth member-step spent 19% of its time in them (benchmarks/README.md)."""

    @staticmethod
    def forward(ctx, gate_up):  # type: ignore[override]
        y = torch.empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2, dtype=gate_up.dtype)
        native.call(native.library().sanlab_silu_gate_fwd, _silu_gate_args(gate_up, y=y))
        ctx.save_for_backward(gate_up)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (gate_up,) = ctx.saved_tensors
        if dy.dtype != gate_up.dtype:  # (torch's formulas promote: `_SiLUGate`'s backward)
            gate, up = gate_up.chunk(2, dim=-1)
            return _silu_gate_backward(gate, up, F.silu(gate), dy)
        grad = torch.empty_like(gate_up)
        native.call(native.library().sanlab_silu_gate_bwd, _silu_gate_args(gate_up, dy=dy.contiguous(), grad=grad))
        return grad
