"""Which attention kernel runs: the one place that picks a backend.

`resolve_backend` picks a batch's backend from `model.attn_backend`, the device and the
row length (once per forward pass, in `build_context`; `attention_kernel` says the same
for a run's meta.json); `attend` and `fused_qkv_attention` run it, and route the inputs
the fused kernel does not take (`fused_supported`) to the explicit kernel or SDPA
(`unfused_cpu_backend`). The FlexAttention rules are pure functions: `flex_fits` (which
rows it takes) and `flex_call` (how it is called: plainly inside a compiled model,
compiled on its own in eager mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError
from sanlab.model import native
from sanlab.model.attention.masks import DOCUMENT, Mask
from sanlab.model.attention.explicit import explicit, explicit_keep
from sanlab.model.attention.fused import fused, fused_mode, fused_products, qkv_attention
from sanlab.model.kernels import NATIVE_DTYPES

if TYPE_CHECKING:
    from sanlab.model.attention.context import AttentionContext
    from sanlab.model.layers import HookPoint


# --------------------------------------------------------------------------- choosing


def resolve_backend(cfg: ModelConfig, tokens: torch.Tensor) -> str:
    """The attention kernel for this batch when `cfg.attn_backend` is `auto`.

    CUDA: FlexAttention with a document block mask (when it imports) for rows it takes
    (`flex_fits`), SDPA with the same mask for the others (short rows, lengths off its
    block size, decoding's growing context). CPU: the fused
    compiled kernel (`sanlab.model.native`; memory O(T), any length) where it builds;
    else the explicit kernel while its saved probabilities fit `CPU_EXPLICIT_MAX_BYTES`
    (in fp32, or in bf16 under bf16 autocast: `explicit_keep`), SDPA with a dense mask
    otherwise (FlexAttention has no CPU backward in this torch, so an explicit `flex`
    request falls back to SDPA there). `attend` still routes inputs the fused kernel
    does not take (fp64, fp16, recurring segment ids) to the explicit kernel or SDPA.
    An explicit `fused` request that cannot be met is a ConfigError naming the reason.
    """
    requested, device = cfg.attn_backend, tokens.device
    if requested == "fused":
        if device.type != "cpu":
            raise ConfigError(f"model.attn_backend=fused: the fused kernel runs on the CPU, not on {device.type}")
        try:
            native.library()
        except native.NativeUnavailable as e:
            raise ConfigError(f"model.attn_backend=fused: the fused CPU kernel is unavailable here: {e}") from None
    if requested == "auto":
        if device.type == "cuda":
            requested = "flex"
        elif native.available():
            requested = "fused"
        else:
            B, T = tokens.shape
            low = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
            low = low if low is not None and low.itemsize == 2 else None
            requested = unfused_cpu_backend(B, cfg.n_heads, T, low)
    if requested == "flex":
        return "flex" if device.type == "cuda" and flex_fits(tokens.shape[1]) and flex_importable() else "sdpa"
    return requested


# FlexAttention's block size (`create_block_mask`'s default BLOCK_SIZE): its kernels tile
# the row in blocks of this many queries and keys, and inductor finds no kernel config for
# a row shorter than one block (H200, torch 2.11: `NoValidChoicesError` on rows of 4 and
# 1 tokens; docs/gpu.md).
FLEX_BLOCK = 128


def flex_fits(seq_len: int) -> bool:
    """Whether FlexAttention takes rows of `seq_len` tokens: a whole number of its blocks
    (`FLEX_BLOCK`), at least one. The rest (short rows, odd lengths, the growing context
    of decoding without a cache) run on SDPA with the same dense document mask."""
    return seq_len >= FLEX_BLOCK and seq_len % FLEX_BLOCK == 0


def flex_importable() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_call(device_type: str, compiling: bool) -> str:
    """How `attend` calls FlexAttention: `plain` inside a compiled model (inductor compiles
    it with the model; a separately compiled flex nested in a compiled model crashed on an
    H200), `compiled` on its own in an eager CUDA model (uncompiled, flex materialises the
    whole score matrix), `plain` on the CPU (eager forward only: the tests' reference)."""
    return "compiled" if device_type == "cuda" and not compiling else "plain"


def attention_kernel(cfg: ModelConfig, device: torch.device, precision: str, seq_len: int | None = None) -> str:
    """The attention kernel a run on `device` in `precision` uses for its usual batches
    (rows of `seq_len` tokens), as a run's meta.json records it: `fused/amx` or
    `fused/portable` (the compiled CPU kernel and where its products run), `explicit`,
    `sdpa` or `flex` (auto's choice depends on the batch shape where the fused kernel is
    unavailable: `explicit/sdpa`; on CUDA, rows FlexAttention does not take run on SDPA:
    `flex_fits`). Raises the ConfigError of an explicit `fused` request that cannot be met."""
    requested = cfg.attn_backend
    if requested in ("flex", "auto") and device.type == "cuda":
        return "flex" if seq_len is not None and flex_fits(seq_len) and flex_importable() else "sdpa"
    if requested in ("auto", "fused"):
        probe = resolve_backend(cfg, torch.zeros(1, 1, dtype=torch.long, device=device))
        if probe == "fused":
            amx = native.library().sanlab_amx_available() and fused_products(precision == "bf16") == 0
            return "fused/amx" if amx else "fused/portable"
        if requested == "auto" and device.type == "cpu":
            return "explicit/sdpa"
        return probe
    if requested == "flex" and device.type != "cuda":
        return "sdpa"
    return requested


def unfused_cpu_backend(batch: int, heads: int, seq_len: int, low: torch.dtype | None) -> str:
    """The CPU kernel where the fused one cannot run: the explicit kernel while the
    probabilities it keeps fit (`explicit_keep`), SDPA beyond."""
    return "explicit" if explicit_keep(batch, heads, seq_len, low) is not None else "sdpa"


def fused_supported(ctx: AttentionContext, head_dim: int, *tensors: torch.Tensor, mask: Mask = DOCUMENT) -> bool:
    """Whether the fused kernel takes these inputs: its backend, CPU tensors in fp32 or
    bf16 with the last dim contiguous, a head dim up to 1024, documents that are runs of
    their segment id and a mask with an interval form, so each row's keys are one
    interval (`ctx.first_keys`)."""
    return (ctx.backend == "fused" and head_dim <= 1024
            and all(t.device.type == "cpu" and t.dtype in NATIVE_DTYPES for t in tensors)
            and ctx.first_keys(mask) is not None)


# --------------------------------------------------------------------------- running


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: AttentionContext,
    pattern_hook: HookPoint | None = None,
    *,
    mask: Mask = DOCUMENT,
) -> torch.Tensor:
    """Document-masked causal attention with GQA, each query limited further by `mask`
    (`masks.Mask`: `DOCUMENT`, every earlier key of its document; `Window(w)`, the last w
    of them; a mixer's own).

    q: (B, H, T, D); k, v: (B, Hkv, T, D) -> (B, H, T, D) in v's dtype. q and k may be in any
    float dtype (a mixer passes them as it computed them, e.g. fp32 after norm and RoPE):
    each backend casts what it needs, so mixers never branch on the backend.
    `ctx` is a `sanlab.model.attention.AttentionContext` (backend and masks). Every backend
    takes the mask: the fused kernel as each row's first key (`ctx.first_keys(mask)`) where
    the mask has that interval form, the others (and the fused backend's fallback) as a
    dense or block mask. When `pattern_hook` has a hook attached, the probabilities are
    materialised by the explicit kernel so analysis can capture `A` (B, H, T, T);
    otherwise `ctx.backend` runs.
    """
    if pattern_hook is not None and pattern_hook.active:
        return explicit(q, k, v, ctx, pattern_hook, mask)
    backend = ctx.backend
    if backend == "fused":
        if fused_supported(ctx, q.shape[-1], q, k, v, mask=mask):
            return fused(q, k, v, ctx.first_keys(mask))
        # fp64 (property tests), fp16, segment ids that repeat after another id, or a mask
        # without an interval form
        low = v.dtype if v.dtype.itemsize == 2 else None
        backend = unfused_cpu_backend(q.shape[0], q.shape[1], q.shape[2], low)
    if backend == "explicit":
        return explicit(q, k, v, ctx, None, mask)
    # SDPA and FlexAttention take q and k in v's dtype; the explicit kernel computes its
    # scores in fp32 from q and k as given (callers may pass them unrounded, in fp32).
    q, k = q.to(v.dtype), k.to(v.dtype)
    if backend == "flex":
        return _flex(q, k, v, ctx.flex_block_mask(mask))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.allowed(mask), enable_gqa=q.shape[1] != k.shape[1])


def fused_qkv_attention(qkv: torch.Tensor, heads: int, kv_heads: int, gq: torch.Tensor, gk: torch.Tensor, eps: float,
                        ctx: AttentionContext, pattern_hook: HookPoint | None = None, *,
                        mask: Mask = DOCUMENT) -> torch.Tensor | None:
    """Softmax attention from the QKV product with the per-head QK-norm (gains gq, gk; eps)
    then RoPE on q and k, in one op (`qkv_attention`): (B, T, (H + 2·Hkv)·D) -> (B, T, H·D),
    the heads merged, in qkv's dtype (what W_o reads); `mask` as `attend`'s. None where
    the fused kernel does not take it (`fused_supported`, fp32 gains, an even head dim, no
    pattern hook to feed): the caller then runs `norm_rope` and `attend`, the same function
    in several ops."""
    D = qkv.shape[-1] // (heads + 2 * kv_heads)
    if ((pattern_hook is not None and pattern_hook.active) or D % 2 or qkv.stride(-1) != 1
            or not fused_supported(ctx, D, qkv, mask=mask)
            or not gq.dtype == gk.dtype == ctx.cos.dtype == torch.float32):
        return None
    return qkv_attention(qkv, gq.contiguous(), gk.contiguous(), ctx.cos.contiguous(), ctx.sin.contiguous(),
                         ctx.first_keys(mask), eps, heads, kv_heads, fused_mode(qkv))[0]


_compiled_flex = None


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: object) -> torch.Tensor:
    """FlexAttention under `block_mask` (built before the model's compiled region:
    `AttentionContext.build_masks`), called as `flex_call` says."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if flex_call(q.device.type, torch.compiler.is_compiling()) == "compiled":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
