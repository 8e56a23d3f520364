"""The fused CPU attention kernel's glue: the compiled kernels (`csrc/attention.c`,
`csrc/attention_amx.c`, loaded by `sanlab.model.native`) as torch custom ops with their
compiled backwards, and which products they run (`fused_products`).
"""

from __future__ import annotations

import os

import torch

from sanlab.model import native
from sanlab.model.kernels import NATIVE_DTYPES

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


def fused_mode(*inputs: torch.Tensor) -> int:
    """`fused_products` for these inputs: low precision when any is bf16."""
    return fused_products(any(t.dtype == torch.bfloat16 for t in inputs))


# The fused kernel runs as torch custom ops (`sanlab::fused_attention` on q, k, v, and
# `sanlab::qkv_attention` on the raw QKV product with the QK-norm and RoPE applied inside),
# each with its compiled backward: FlopCounterMode sees them (`accounting` counts them as
# SDPA's full square), torch.compile traces around them, autograd calls the backward.
# The C entry points take one `sanlab_attn_args` (csrc/sanlab.h; `native.AttnArgs`), each
# operand a `sanlab_tensor` (pointer, is-bf16, three strides); the QK-norm fields stay NULL
# for the plain op.


def _operand(x: torch.Tensor) -> native.Tensor:
    """A (B, h, T, D) tensor (d contiguous) as a C operand."""
    return native.tensor(x, x.stride(0), x.stride(1), x.stride(2))


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
    native.call(lib.sanlab_attn_fwd, native.AttnArgs(
        B=B, H=H, Hkv=k.shape[1], T=T, D=D, q=_operand(q), k=_operand(k), v=_operand(v), start=starts.data_ptr(),
        out=out.data_ptr(), lse=lse.data_ptr(), y=_operand(y), nthreads=torch.get_num_threads(), mode=mode))
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
    if dy.dtype not in NATIVE_DTYPES or dy.stride(-1) != 1:
        dy = dy.float().contiguous()
    dq = torch.empty(B, H, T, D, dtype=q.dtype)
    dk = torch.empty(B, Hkv, T, D, dtype=k.dtype)
    dv = _bthd(B, T, Hkv, D, v.dtype)
    native.call(lib.sanlab_attn_bwd, native.AttnArgs(
        B=B, H=H, Hkv=Hkv, T=T, D=D, q=_operand(q), k=_operand(k), v=_operand(v), dout=_operand(dy),
        start=starts.data_ptr(), out=out.data_ptr(), lse=lse.data_ptr(), dq=_operand(dq), dk=_operand(dk),
        dv=_operand(dv), nthreads=torch.get_num_threads(), mode=mode))
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
    _no_zero_grads(ctx)


def _no_zero_grads(ctx) -> None:  # noqa: ANN001
    """The kernels' kept outputs (out, lse, 1/RMS) are never differentiated: autograd would
    otherwise hand the backward a zero gradient for each, allocated and filled every step
    (for the demo SAN at M = 8, ~1 ms a layer for the fp32 (B, H, T, D) `out` alone). Their
    gradients arrive as None instead, and so does y's where nothing downstream used it."""
    ctx.set_materialize_grads(False)


def _fused_backward(ctx, dy, dout, dlse):  # noqa: ANN001, ANN202 - out and lse are not differentiated
    if dy is None:
        return None, None, None, None, None
    q, k, v, starts, out, lse = ctx.saved_tensors
    return (*fused_attention_backward(dy, q, k, v, starts, out, lse, ctx.mode), None, None)


torch.library.register_autograd("sanlab::fused_attention", _fused_backward, setup_context=_fused_setup)


def _qkv_operands(qkv: torch.Tensor, H: int, Hkv: int, D: int) -> dict[str, native.Tensor]:
    """q, k and v inside a (B, T, (H + 2·Hkv)·D) QKV tensor: heads D apart, rows st apart."""
    sb, st = qkv.stride(0), qkv.stride(1)
    return {"q": native.tensor(qkv, sb, D, st), "k": native.tensor(qkv, sb, D, st, H * D),
            "v": native.tensor(qkv, sb, D, st, (H + Hkv) * D)}


def _norm_fields(gq: torch.Tensor, gk: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """The QK-norm's fields of `native.AttnArgs`."""
    return {"gq": gq.data_ptr(), "gk": gk.data_ptr(), "eps": eps, "cos": cos.data_ptr(), "sin": sin.data_ptr(),
            "csb": cos.stride(0), "cst": cos.stride(1)}


@torch.library.custom_op("sanlab::qkv_attention", mutates_args=())
def qkv_attention(qkv: torch.Tensor, gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  starts: torch.Tensor, eps: float, heads: int, kv_heads: int, mode: int, gain_batches: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SoftmaxAttention's core from the QKV product: q and k through the per-head QK-norm
    (gains gq, gk; `norm_rope_reference`) and RoPE as the kernel reads them, then
    `fused_attention`, the output written with the heads merged.

    qkv (B, T, (H + 2·Hkv)·D) fp32 or bf16 with its last dim contiguous; gq, gk (D,)
    fp32; cos, sin (B, T, 1, D) fp32 (`rope_tables`; the first D/2 of each row used);
    starts (B, T) int32. With `gain_batches` g > 0 (members folded into the batch), gq and gk
    are (B / g, D), one set of gains per g batches. Returns y (B, T, H·D) in qkv's dtype, the output in fp32
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
    native.call(lib.sanlab_attn_fwd, native.AttnArgs(
        B=B, H=heads, Hkv=kv_heads, T=T, D=D, **_qkv_operands(qkv, heads, kv_heads, D), start=starts.data_ptr(),
        **_norm_fields(gq, gk, eps, cos, sin), rq=rq.data_ptr(), rk=rk.data_ptr(), out=out.data_ptr(),
        lse=lse.data_ptr(), y=native.tensor(y, y.stride(0), D, y.stride(1)), nthreads=torch.get_num_threads(),
        mode=mode, gain_batches=gain_batches))
    return y, out, lse, rq, rk


@qkv_attention.register_fake
def _(qkv, gq, gk, cos, sin, starts, eps, heads, kv_heads, mode, gain_batches=0):  # noqa: ANN001, ANN202
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
                           kv_heads: int, mode: int, gain_batches: int = 0
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dqkv (in qkv's dtype and shape), dgq, dgk (in gq's shape) of `qkv_attention` for y's gradient dy."""
    lib = native.library()
    B, T, W = qkv.shape
    D = W // (heads + 2 * kv_heads)
    if dy.dtype not in NATIVE_DTYPES or dy.stride(-1) != 1:
        dy = dy.float().contiguous()
    dqkv = torch.empty(B, T, W, dtype=qkv.dtype)
    dgq = torch.empty(gq.shape, dtype=torch.float32)
    dgk = torch.empty(gk.shape, dtype=torch.float32)
    grads = _qkv_operands(dqkv, heads, kv_heads, D)
    native.call(lib.sanlab_attn_bwd, native.AttnArgs(
        B=B, H=heads, Hkv=kv_heads, T=T, D=D, **_qkv_operands(qkv, heads, kv_heads, D),
        dout=native.tensor(dy, dy.stride(0), D, dy.stride(1)), start=starts.data_ptr(),
        **_norm_fields(gq, gk, eps, cos, sin), rq=rq.data_ptr(), rk=rk.data_ptr(), dgq=dgq.data_ptr(),
        dgk=dgk.data_ptr(), out=out.data_ptr(), lse=lse.data_ptr(), dq=grads["q"], dk=grads["k"], dv=grads["v"],
        nthreads=torch.get_num_threads(), mode=mode, gain_batches=gain_batches))
    return dqkv, dgq, dgk


@qkv_attention_backward.register_fake
def _(dy, qkv, gq, gk, cos, sin, starts, out, lse, rq, rk, eps, heads, kv_heads, mode, gain_batches=0):  # noqa: ANN001, ANN202
    return torch.empty_like(qkv), torch.empty_like(gq), torch.empty_like(gk)


def _qkv_setup(ctx, inputs, output) -> None:  # noqa: ANN001
    qkv, gq, gk, cos, sin, starts, eps, heads, kv_heads, mode, *gain_batches = inputs
    _, out, lse, rq, rk = output
    ctx.save_for_backward(qkv, gq, gk, cos, sin, starts, out, lse, rq, rk)
    ctx.args = (eps, heads, kv_heads, mode, *gain_batches)
    _no_zero_grads(ctx)


def _qkv_backward(ctx, dy, *_):  # noqa: ANN001, ANN002, ANN202 - only y is differentiated
    if dy is None:
        return (None,) * 11
    qkv, gq, gk, cos, sin, starts, out, lse, rq, rk = ctx.saved_tensors
    dqkv, dgq, dgk = qkv_attention_backward(dy, qkv, gq, gk, cos, sin, starts, out, lse, rq, rk, *ctx.args)
    return dqkv, dgq.to(gq.dtype), dgk.to(gk.dtype), None, None, None, None, None, None, None, None


torch.library.register_autograd("sanlab::qkv_attention", _qkv_backward, setup_context=_qkv_setup)


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """`fused_attention`'s output (in v's dtype) for q, k, v with any strides; row i of
    batch b sees keys [starts[b, i], i]."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return fused_attention(q, k, v, starts, fused_mode(q, k, v))[0]
