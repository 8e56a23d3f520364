"""Building blocks: ZCN / RMS norm, RoPE, SwiGLU, hook points, and attention kernels.

Everything here is single-device and has no knowledge of the config file format
beyond `ModelConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig


class HookPoint(nn.Module):
    """Identity module marking a tensor that analysis may capture.

    Its module path is its stable name (`blocks.3.attn.pattern`). Forward hooks
    registered on it see the tensor; with no hooks it costs a function call.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks)


class RMSNorm(nn.Module):
    """RMS norm computed in fp32.

    zero_centered=True is the paper's ZCN: (1 + γ) ⊙ z / RMS(z) with γ initialised
    to 0, so the parameter's origin is the identity scale (SPEC §1.1).
    zero_centered=False is plain RMS norm with γ initialised to 1; with the gains
    undecayed the two differ by a constant shift (the noise-floor pair of SPEC §1.4).
    """

    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = True, feeds_matmul: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        # A norm whose only reader is a matmul writes its result in the autocast dtype
        # directly (the matmul would cast it anyway): one pass over the activations less
        # each way. Computed in fp32 all the same.
        self.feeds_matmul = feeds_matmul
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        cast = self.feeds_matmul and torch.is_autocast_enabled(dev)
        return self.normalize(upcast(x), torch.get_autocast_dtype(dev) if cast else x.dtype)

    def normalize(self, x32: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The norm on an already-upcast tensor, result in `out_dtype` (default x32's)."""
        gain = self.weight.to(x32.dtype)
        return _RMSNorm.apply(x32, 1.0 + gain if self.zero_centered else gain, self.eps, out_dtype or x32.dtype)


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


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (norms and RoPE run in fp32, SPEC §1.1); fp64 stays fp64 so
    property tests can be exact."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def make_norm(cfg: ModelConfig, dim: int, feeds_matmul: bool = False) -> RMSNorm:
    return RMSNorm(dim, cfg.norm_eps, zero_centered=cfg.norm == "zcrms", feeds_matmul=feeds_matmul)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotate-half RoPE at integer `positions` (B, T) -> (B, T, 1, D)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, D)
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, x·cos + rotate_half(x)·sin. x: (B, T, H, D); cos/sin: (B, T, 1, D)
    from `rope_tables` (both halves equal). Computed in fp32, returned in x's dtype."""
    half = x.shape[-1] // 2
    return _RoPE.apply(upcast(x), cos[..., :half], sin[..., :half]).to(x.dtype)


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
    def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, sign: float) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        if torch.compiler.is_compiling():  # inductor fuses the plain formula (and rejects out= into views)
            return torch.cat([x1 * c - sign * x2 * s, x2 * c + sign * x1 * s], dim=-1)
        dtype = torch.promote_types(x.dtype, c.dtype)
        if x.dim() == 4:  # (B, T, H, D) laid out as (B, H, T, D): attention reads heads without a copy
            B, T, H, D = x.shape
            out = torch.empty(B, H, T, D, dtype=dtype, device=x.device).transpose(1, 2)
        else:
            out = torch.empty(x.shape, dtype=dtype, device=x.device)
        o1, o2 = out[..., :half], out[..., half:]
        torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-sign)
        torch.mul(x2, c, out=o2).addcmul_(x1, s, value=sign)
        return out


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its segment (document): restarts at 0. (B, T) -> (B, T)."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    is_start = torch.ones_like(segment_ids, dtype=torch.bool)
    is_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_idx = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


@dataclass
class AttentionContext:
    """Per-batch data every attention layer shares: RoPE tables and the document mask.

    Built once per forward pass in `LM.forward`, not once per layer; masks are built
    on first use and cached.
    """

    segment_ids: torch.Tensor  # (B, T)
    positions: torch.Tensor  # (B, T) position within the document
    cos: torch.Tensor  # (B, T, 1, head_dim)
    sin: torch.Tensor  # (B, T, 1, head_dim)
    backend: str  # "explicit" | "sdpa" | "flex"
    _dense_mask: torch.Tensor | None = None
    _block_mask: object | None = None
    _additive: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @property
    def dense_mask(self) -> torch.Tensor:
        """(B, 1, T, T) bool: causal AND same document. True = may attend."""
        if self._dense_mask is None:
            seg = self.segment_ids
            T = seg.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=seg.device).tril()
            same = seg[:, :, None] == seg[:, None, :]
            self._dense_mask = (same & causal)[:, None]
        return self._dense_mask

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, T, T): 0 where attention is allowed, -inf elsewhere."""
        if dtype not in self._additive:
            bias = torch.zeros(self.dense_mask.shape, dtype=dtype, device=self.segment_ids.device)
            self._additive[dtype] = bias.masked_fill_(~self.dense_mask, float("-inf"))
        return self._additive[dtype]

    @property
    def block_mask(self) -> object:
        if self._block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            seg = self.segment_ids

            def doc_causal(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex mask signature
                return (q_idx >= kv_idx) & (seg[b, q_idx] == seg[b, kv_idx])

            B, T = seg.shape
            self._block_mask = create_block_mask(doc_causal, B, None, T, T, device=seg.device)
        return self._block_mask


# On the CPU the explicit kernel (`_ExplicitAttention`) runs while the probabilities it
# keeps for the backward, about B·H·T·(T + chunk)/2 fp32 values a layer, stay under this
# bound; SDPA beyond. Measured on a 2-core AVX512-BF16 CPU (attention forward + backward,
# bf16 autocast, 2048 tokens a batch, H 8/4, D 32; benchmarks/bench_attention.py): 3.7x
# faster than SDPA's CPU flash kernel at T = 64, 2.0x at 128, 1.5x at 256, 1.4x at 512,
# 1.1x at 1024, and more accurate than it at every T (output and q, k, v gradients).
CPU_EXPLICIT_MAX_SCORES = 1 << 24
# Query rows per block of the explicit kernel: blocks above the diagonal are skipped, so
# a causal layer computes ~(T + chunk)/(2T) of the full score matrix. 64 was fastest at
# every T from 128 to 1024 on that CPU (32 and 128 within 10%).
EXPLICIT_CHUNK = 64


def explicit_scores(batch: int, heads: int, seq_len: int) -> int:
    """Probabilities the explicit kernel keeps for the backward (one layer)."""
    chunk = min(EXPLICIT_CHUNK, seq_len)
    return batch * heads * seq_len * (seq_len + chunk) // 2


def resolve_backend(cfg: ModelConfig, tokens: torch.Tensor) -> str:
    """The attention kernel for this batch when `cfg.attn_backend` is `auto`.

    CUDA: FlexAttention with a document block mask (when it imports). CPU: the explicit
    kernel while its saved probabilities fit `CPU_EXPLICIT_MAX_SCORES`, SDPA with a dense
    mask otherwise (FlexAttention has no CPU backward in this torch, so an explicit
    `flex` request falls back to SDPA there).
    """
    requested, device = cfg.attn_backend, tokens.device
    if requested == "auto":
        if device.type == "cuda":
            requested = "flex"
        else:
            B, T = tokens.shape
            requested = "explicit" if explicit_scores(B, cfg.n_heads, T) <= CPU_EXPLICIT_MAX_SCORES else "sdpa"
    if requested == "flex":
        if device.type != "cuda":
            return "sdpa"
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError:
            return "sdpa"
    return requested


def build_context(
    cfg: ModelConfig, tokens: torch.Tensor, segment_ids: torch.Tensor | None
) -> AttentionContext:
    if segment_ids is None:
        segment_ids = torch.zeros_like(tokens)
    positions = segment_positions(segment_ids)
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
    return AttentionContext(
        segment_ids=segment_ids,
        positions=positions,
        cos=cos,
        sin=sin,
        backend=resolve_backend(cfg, tokens),
    )


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
    The forward keeps each block's probabilities P; the backward is, per block,
    dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O)), dQ = dS K/√D, dK += dSᵀ Q/√D.
    The scores, the softmax, P V and dO Vᵀ (from which dS subtracts a row mean) are at
    least fp32: rounding the scores to bf16 would double the error at realistic score
    sizes. When the incoming gradient is bf16 (autocast), the three products that
    consume P or dS in the backward (Pᵀ dO, dS K, dSᵀ Q) run in bf16, as FlashAttention's
    do: 3x faster on the CPU, with gradients as accurate as SDPA's (tested). dK and dV
    accumulate over blocks in fp32; the result has v's dtype.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, chunk):  # type: ignore[override]
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
            probs.append(p)
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
            dv[:, :e] += torch.bmm(p.to(lp).transpose(1, 2), do5_lp[:, :, :, s:e].reshape(B * Hkv, n, D))
            ds = torch.bmm(dob, v3[:, :e].transpose(1, 2))
            ds.view(B, Hkv, rep, e - s, e).sub_(delta[:, :, :, s:e]).mul_(p.view(B, Hkv, rep, e - s, e))
            ds = ds.to(lp)
            dq[:, :, :, s:e] = torch.bmm(ds, k3_lp[:, :e]).view(B, Hkv, rep, e - s, D)
            dk[:, :e] += torch.bmm(ds.transpose(1, 2), q5_lp[:, :, :, s:e].reshape(B * Hkv, n, D))
        qt, kt, vt = ctx.dtypes
        H = Hkv * rep
        return (dq.mul_(scale).view(B, H, T, D).to(qt), dk.view(B, Hkv, T, D).to(kt),  # (q5 is scaled)
                dv.view(B, Hkv, T, D).to(vt), None, None)


def _explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext, pattern_hook: HookPoint | None
) -> torch.Tensor:
    """The explicit kernel; with a pattern hook, plain autograd ops that materialise the
    whole (B, H, T, T) probability tensor for the hook (same arithmetic, fp32 scores)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # keep the scores in fp32 under autocast
        bias = ctx.additive_mask(dt)
        if pattern_hook is None:
            return _ExplicitAttention.apply(q, k, v, bias, EXPLICIT_CHUNK)
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

    q: (B, H, T, D); k, v: (B, Hkv, T, D) -> (B, H, T, D).
    When `pattern_hook` has a hook attached, the probabilities are materialised by the
    explicit kernel so analysis can capture `A` (B, H, T, T); otherwise `ctx.backend` runs.
    """
    if pattern_hook is not None and pattern_hook.active:
        return _explicit(q, k, v, ctx, pattern_hook)
    if ctx.backend == "explicit":
        return _explicit(q, k, v, ctx, None)
    if ctx.backend == "flex":
        return _flex(q, k, v, ctx.block_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.dense_mask, enable_gqa=q.shape[1] != k.shape[1])


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


class SwiGLU(nn.Module):
    """W_down(SiLU(W_gate x) ⊙ W_up x), no biases (SPEC §1.1 control arm)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate and up as one product: x is read and cast once, dL/dx is one matmul
        gate_up = F.linear(x, torch.cat([self.w_gate.weight, self.w_up.weight]))
        return self.w_down(_SiLUGate.apply(gate_up))

    def output_weights(self) -> list[nn.Parameter]:
        return [self.w_down.weight]
