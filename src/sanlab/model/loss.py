"""The fused LM head + loss (`head_loss`: logits x Wᵀ, cross-entropy and z-loss chunk by
chunk, gradients included, without the (N, V) logits) and its reference formula
(`lm_loss`: the same loss from logits already at hand).
"""

from __future__ import annotations

import torch

from sanlab.model import native


def _loss_chunk_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    """Rows per chunk of the fused head + loss. On the CPU ~2M logits (8 MB in fp32): the
    passes over a chunk stay in the last-level cache, and the head's matmuls are large
    enough to run near peak (measured: benchmarks/README.md). On accelerators ~128M
    (512 MB), which bounds the fp32 temporaries (a 16×2048-token micro-batch at V=16,384
    would otherwise need 2 GB) while keeping the number of kernel launches small."""
    budget = 1 << 21 if device.type == "cpu" else 1 << 27
    return max(1, min(n_rows, budget // vocab))


def _dw_group_rows(n_rows: int, vocab: int, chunk: int, device: torch.device) -> int:
    """Rows per product of the head's weight gradient dW = Σ gᵀ x: a whole number of loss
    chunks. Each product's (V, d) result is added to the fp32 dW in full, so per chunk
    (128 rows at V=16,384) that addition streamed dW through memory 32 times a
    4096-token step. On the CPU the chunks' gradients are kept for ~16M logits (32 MB in
    bf16) and multiplied together (faster: benchmarks/README.md). On accelerators each
    chunk is already that large."""
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
    reduction in at least fp32. On the CPU a chunk's rows go through the compiled kernel
    (`_compiled_rows`: one visit per row, the gradient written straight in x's dtype,
    about 6% of the demo SAN's step); elsewhere, or without the kernels, through the
    torch formulas (`_torch_rows`). Returns (loss, cross-entropy), the second not differentiable.
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
        compiled = _compiled(x, weights)
        for i in range(0, N, step):
            j = slice(i, i + step)
            n = min(step, N - i)
            g0 = i // group * group if grad else i  # first row of this chunk's dW group
            g = g_rows[i - g0:i - g0 + n] if grad else None  # this chunk's gradient rows
            if compiled:
                # with a gradient, the logits are written where their gradient goes (the kernel
                # reads a row whole before it writes it): half the memory, which stays in cache
                logits = x[j] @ w_x.t() if g is None else torch.mm(x[j], w_x.t(), out=g)
                lse, x_t = _compiled_rows(logits, targets[j], weights[j], c, g)
            else:
                lse, x_t = _torch_rows(x[j], w_x, targets[j], weights[j], c, g)
            ce += ((lse - x_t) * weights[j]).sum()
            z += (lse.square() * weights[j]).sum()
            if grad:
                dx[j] = g @ w_x
                last = min(N, g0 + group)
                if i + n == last:  # the group is complete: its dW product
                    dw += _dw_product(g_rows[:last - g0], x[g0:last])
        if grad:
            ctx.save_for_backward(dx, dw)
        ctx.mark_non_differentiable(ce)
        return ce + c * z, ce

    @staticmethod
    def backward(ctx, g_loss, g_ce):  # type: ignore[override]
        dx, dw = ctx.saved_tensors
        return dx * g_loss.to(dx.dtype), dw * g_loss, None, None, None, None


def _torch_rows(x: torch.Tensor, w_x: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, c: float,
                grad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`_compiled_rows` in torch formulas (accelerators, fp64, no compiled kernels) on the
    chunk's logits x w_xᵀ: each row's lse and target logit in at least fp32, and the
    gradient into `grad`. The logits are dropped before the gradient is formed (on an
    accelerator a chunk's fp32 logits are 512 MB)."""
    logits = (x @ w_x.t()).to(torch.promote_types(x.dtype, torch.float32))  # (n, V)
    t = targets[:, None]
    # softmax is one fused pass per row and p is what the gradient needs; lse = x_t − log p_t
    # is exact in fp32 while p_t is a normal number. Rows whose p_t is too small for that (a
    # target logit ~87 below the row's top) take logsumexp over their logits instead.
    x_t = logits.gather(-1, t).squeeze(-1)
    p = torch.softmax(logits, dim=-1)
    lse = _lse_from_target(logits, x_t, p.gather(-1, t).squeeze(-1), sync_free=logits.device.type != "cpu")
    del logits
    if grad is not None:
        # w(1 + 2c·lse)·(p − onehot/(1 + 2c·lse)): the target's subtraction in fp32 (it
        # cancels when p_t ≈ 1), the scaling in place, then one cast
        scale = 1.0 + 2.0 * c * lse
        p.scatter_add_(-1, t, -(1.0 / scale)[:, None]).mul_((weights * scale)[:, None])
        grad.copy_(p)
    return lse, x_t


def _compiled(x: torch.Tensor, weights: torch.Tensor) -> bool:
    """Whether the compiled rows (`_compiled_rows`) can take this head: the CPU kernels
    built here, eager mode, fp32 or bf16 hidden states and fp32 weights."""
    return (x.dtype in (torch.float32, torch.bfloat16) and weights.dtype == torch.float32
            and native.ready(x))


def _dw_product(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """gᵀ x, (V, d), from the gradient rows g (n, V) and the rows x (n, d). In fp32 on the
    CPU as (xᵀ g)ᵀ: MKL forms it ~1.5x faster (4.3 against 6.6 ms at the demo's head, n 2048,
    V 1024, d 64, on an AVX2 CPU) with the same bits (checked: groups of 128-2048 rows, V
    777-16,384, d 32-64, 1 and 2 threads); bf16 products (oneDNN's where the CPU has them)
    and other devices keep the form they had."""
    if g.dtype == torch.float32 and g.device.type == "cpu":
        return (x.t() @ g).t()
    return g.t() @ x


def _compiled_rows(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, c: float,
                   grad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's lse and target logit from the (n, V) logits by `csrc/head.c`, and, into
    `grad` (n, V) when given, the loss's gradient with respect to them (the formula of
    `_HeadCrossEntropyZLoss`, in one visit per row instead of five passes over the chunk)."""
    n, V = logits.shape
    lse = torch.empty(n, dtype=torch.float32)
    x_t = torch.empty(n, dtype=torch.float32)
    targets, weights = targets.to(torch.int64).contiguous(), weights.contiguous()
    native.call(native.library().sanlab_head_ce, native.HeadCEArgs(
        n=n, V=V, logits=logits.data_ptr(), logits_bf16=int(logits.dtype == torch.bfloat16), ld=logits.stride(0),
        targets=targets.data_ptr(), weights=weights.data_ptr(), c=float(c), lse=lse.data_ptr(), x_t=x_t.data_ptr(),
        grad=0 if grad is None else grad.data_ptr(), grad_bf16=int(grad is not None and grad.dtype == torch.bfloat16),
        ld_grad=0 if grad is None else grad.stride(0), nthreads=torch.get_num_threads()))
    return lse, x_t


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
