"""Many small models at once: M members of one architecture as one batched model.

Members share an architecture and differ only in what training sees (LR, seed, data).
Every weight carries a leading member dimension, named exactly as the solo `LM` names it
(`blocks.0.attn.wq.weight` is (M, H·D, d) here, (H·D, d) there), so a member's weights are
a slice: `member_state(m)` is a solo model's state dict.

How each part runs (benchmarks/bench_members.py measured the choice):
- the linear layers as batched matmuls (`torch.bmm` on (M, B·T, d)), under autocast as
  the solo model's `F.linear`, with its backward's products (`_BmmLinear`);
- the embedding as one lookup in the (M·V, d) table, tokens offset by their member;
- the kernels with per-member weights run once over all members, the members folded into
  their batch (M·B rows): the compiled RMS norm with one gain per member's rows
  (`group_rows`), the fused attention kernel with one pair of QK-norm gains per member's
  B rows (`gain_batches`), the gated residual with one gate per member (`group_count`).
  Each member's gain gradient is summed over its own rows in the chunks and order the
  solo kernel uses, so every value is the solo kernel's on the member's rows, bit for bit
  (the tests compare them with `torch.equal`);
- the fused head + loss runs once per member (each call is already one 2M-logit chunk at
  the demo shape, the size the solo head picks to stay in cache), and so do the kernels'
  plain-PyTorch fallbacks (no compiled kernels, or fp64), inside one autograd node
  (`_PerMember`), by the same functions the solo model calls;
- with another attention backend (SDPA, FlexAttention, the explicit kernel: a GPU's, or
  a CPU's without the compiled kernels), the QK-norm and RoPE per member
  (`member_norm_rope`: the compiled kernel once per member, else `_MemberNormRoPE`, the
  solo formulas over all members at once) and then one attention call over the members
  folded into the batch, as the fused kernel is called (measured without the compiled
  kernels, demo SAN, M 8, one thread: 57-65 -> 53-56 ms a member against one call per
  member; a member still equals its solo run on these backends, tests/test_members.py);
- the RoPE tables, document positions and row starts are built once for all members.

Measured (a profile of a demo-shape step, SAN 5L d64 T128 batch 16, M = 8, one thread):
the attention kernel's forward and backward take ~55% of a step, members or solo, and
cost the same per member either way (their work is per query-key score); batching
removes the per-member stacking and dispatch (the rest), so a member step costs ~1/1.15
of a solo step on one thread. That bounds what batching can give at this shape: the
3x of issue 44 needs a faster attention kernel at head_dim 16, not fewer calls. (After
the one-vector QK-norm/RoPE rows and the compiled head rows of 2026-12-06, measured the
same way: 35.4 ms a solo step, 30.5 ms a member-step, 1/1.16; the compiled kernels, the
norms and head included, ~40% of a solo step.)

`torch.func` (`stack_module_state` + `vmap`) was the other route: it does not run the
project's kernels (hand-written `autograd.Function`s and ctypes calls on data pointers
have no batching rule), so under vmap the model would fall back to the plain formulas,
which the solo model does not run (numerics differ) and which are slower on the CPU.

Supported: softmax attention in every layer (QK-norm on), the SAN (`state_mixer=none`)
and the standard arm (`swiglu`), any norm and residual rule, no sandwich norm, no
frozen weights (`members_unsupported` says why not otherwise).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model import native
from sanlab.model.attention import build_context
from sanlab.model.attention.context import AttentionContext
from sanlab.model.attention.dispatch import attend, fused_supported
from sanlab.model.attention.fused import fused_mode, qkv_attention
from sanlab.model.kernels import (NATIVE_DTYPES, _GatedResidual, _NativeGatedResidual, native_gated_residual,
                                  rope_rotate, silu_gate, upcast)
from sanlab.model.lm import LM
from sanlab.model.loss import head_loss
from sanlab.model.member_rules import members_unsupported
from sanlab.model.norms import (_NativeRMSNorm, _RMSNorm, gained_rope, norm_rope, qk_normalise,
                                qk_normalise_backward)


# --------------------------------------------------------------------------- one kernel per member


class _SubCtx:
    """Stands in for autograd's ctx when `_PerMember` calls a kernel's forward/backward."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[torch.Tensor, ...] = ()

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass


class _PerMember(torch.autograd.Function):
    """`fn` (an autograd.Function class, or anything with its static forward/backward) run
    once per member in one autograd node: argument i is sliced `args[i][m]` where
    `stacked[i]`, passed whole otherwise. The output is the members' outputs stacked;
    a stacked input's gradient is the members' stacked, a shared one's their sum."""

    @staticmethod
    def forward(ctx, fn, stacked, *args):  # type: ignore[override]
        M = next(a.shape[0] for a, s in zip(args, stacked) if s)
        needs = tuple(ctx.needs_input_grad[2:])
        ctx.fn, ctx.stacked, ctx.subs = fn, stacked, []
        outs = []
        for m in range(M):
            sub = _SubCtx(needs)
            outs.append(fn.forward(sub, *(a[m] if s else a for a, s in zip(args, stacked))))
            ctx.subs.append(sub)
        return torch.stack(outs)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        per = [ctx.fn.backward(sub, dy[m]) for m, sub in enumerate(ctx.subs)]
        ctx.subs = []
        grads: list[torch.Tensor | None] = []
        for i, s in enumerate(ctx.stacked):
            gs = [g[i] for g in per]
            if gs[0] is None or not ctx.needs_input_grad[2 + i]:
                grads.append(None)
            else:
                grads.append(torch.stack(gs) if s else torch.stack(gs).sum(0))
        return (None, None, *grads)


def _rms_norm_fn(x32: torch.Tensor, out_dtype: torch.dtype) -> Any:
    """The kernel `sanlab.model.norms.rms_norm` picks for one member's slice of x32."""
    if (native.ready(x32) and x32.dtype == torch.float32 and x32.is_contiguous() and out_dtype in NATIVE_DTYPES):
        return _NativeRMSNorm
    return _RMSNorm


class _MemberNativeRMSNorm(torch.autograd.Function):
    """`_NativeRMSNorm` over all members' rows in one call, each member's rows with its own
    gain (`group_rows`); each member's dγ summed over its own rows in the chunks the solo
    kernel uses, so every value is the solo kernel's on the member's rows."""

    @staticmethod
    def forward(ctx, x, gain, eps, out_dtype):  # type: ignore[override]
        M, d = x.shape[0], x.shape[-1]
        out = torch.empty(x.shape, dtype=out_dtype)
        r = torch.empty(x.shape[:-1], dtype=torch.float32)
        gain = gain.contiguous()
        native.call(native.library().sanlab_rms_norm_fwd, native.RMSNormArgs(
            n=x.numel() // d, d=d, x=x.data_ptr(), gain=gain.data_ptr(), eps=eps, r=r.data_ptr(), out=out.data_ptr(),
            out_bf16=int(out_dtype == torch.bfloat16), nthreads=torch.get_num_threads(),
            group_rows=x.numel() // d // M))
        ctx.save_for_backward(x, gain, r)
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, gain, r = ctx.saved_tensors
        M, d = x.shape[0], x.shape[-1]
        if dy.dtype not in NATIVE_DTYPES or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dx = torch.empty_like(x)
        dgain = torch.empty(M, d, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        native.call(native.library().sanlab_rms_norm_bwd, native.RMSNormArgs(
            n=x.numel() // d, d=d, x=x.data_ptr(), gain=gain.data_ptr(), r=r.data_ptr(), dy=dy.data_ptr(),
            dy_bf16=int(dy.dtype == torch.bfloat16), dx=dx.data_ptr(),
            dgain=None if dgain is None else dgain.data_ptr(), nthreads=torch.get_num_threads(),
            group_rows=x.numel() // d // M))
        return dx, dgain, None, None


def member_rms_norm(x: torch.Tensor, weight: torch.Tensor, zero_centered: bool, eps: float,
                    feeds_matmul: bool) -> torch.Tensor:
    """`RMSNorm.forward` per member: x (M, ..., d), weight (M, d)."""
    dev = x.device.type
    cast = feeds_matmul and torch.is_autocast_enabled(dev)
    x32 = upcast(x).contiguous()
    out_dtype = torch.get_autocast_dtype(dev) if cast else x32.dtype
    gain = weight.to(x32.dtype)
    gain = 1.0 + gain if zero_centered else gain
    fn = _rms_norm_fn(x32, out_dtype)
    if fn is _NativeRMSNorm and gain.dtype == torch.float32:
        return _MemberNativeRMSNorm.apply(x32, gain, eps, out_dtype)
    return _PerMember.apply(fn, (True, True, False, False), x32, gain, eps, out_dtype)


class _MemberNormRoPE(torch.autograd.Function):
    """`sanlab.model.norms._NormRoPE` over all members at once: x (M, B, T, h, D), each
    member's rows with its own gain (M, D), the tables (M·B, T, 1, D/2) of the folded batch.
    Each value is the solo function's elementwise formula on the member's rows, and each
    member's gain gradient is its own rows' sum by the solo call (same shapes), so a member
    gets the solo bits; one set of ops for all members, not M."""

    @staticmethod
    def forward(ctx, x, gain, eps, c, s):  # type: ignore[override]
        M, B, T, h, D = x.shape
        half = D // 2
        with torch.autocast(x.device.type, enabled=False):
            n, r = qk_normalise(x, eps)  # (M, B, T, h, D), (M, B, T, h, 1)
            c, s = c.view(M, B, T, 1, half), s.view(M, B, T, 1, half)
            out = torch.empty(M, B, h, T, D, dtype=torch.promote_types(n.dtype, c.dtype),
                              device=x.device).transpose(2, 3)
            gained_rope(n, gain.view(M, 1, 1, 1, D), c, s, out)
        ctx.save_for_backward(n, r, gain, c, s)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        n, r, gain, c, s = ctx.saved_tensors
        M, D = n.shape[0], n.shape[-1]
        with torch.autocast(n.device.type, enabled=False):
            u = rope_rotate(dy.to(n.dtype), c, s, -1.0, out=torch.empty_like(n))
            dgain = None
            if ctx.needs_input_grad[1]:
                dgain = torch.stack([torch.linalg.vecdot(n[m].reshape(-1, D), u[m].reshape(-1, D), dim=0)
                                     for m in range(M)]).to(gain.dtype)
            dx = qk_normalise_backward(n, r, u.mul_(gain.view(M, 1, 1, 1, D)), ctx.x_dtype)
        return dx, dgain, None, None, None


def member_norm_rope(x: torch.Tensor, gain: torch.Tensor, eps: float, c: torch.Tensor,
                     s: torch.Tensor) -> torch.Tensor:
    """`sanlab.model.norms.norm_rope` per member: x (M, B, T, h, D), gain (M, D), the
    half-width tables of the folded batch (M·B, T, 1, D/2) -> (M·B, h, T, D), the layout
    `attend` reads. The compiled kernel (a CPU's) runs once per member as the solo model
    calls it; elsewhere (a GPU, no compiled kernels) `_MemberNormRoPE` runs them all."""
    M, B, T, h, D = x.shape
    if native.ready(x):
        outs = [norm_rope(x[m], gain[m], eps, c[m * B:(m + 1) * B], s[m * B:(m + 1) * B]).transpose(1, 2)
                for m in range(M)]
        return torch.cat(outs)
    return _MemberNormRoPE.apply(x, gain, eps, c, s).transpose(2, 3).reshape(M * B, h, T, D)


class _MemberGatedResidual(torch.autograd.Function):
    """`_NativeGatedResidual` over all members at once: x + σ(g_m)·h_m by the same compiled
    kernels, each member's values with its own σ (`group_count`), and its gate's sum in
    the chunks the solo kernel sums."""

    @staticmethod
    def forward(ctx, x, h, g):  # type: ignore[override]
        s = torch.sigmoid(g)  # (M, 1)
        ctx.save_for_backward(h, s)
        return native_gated_residual(x, h, s.reshape(-1))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        h, s = ctx.saved_tensors
        if dy.dtype != torch.float32 or not dy.is_contiguous():
            dy = dy.float().contiguous()
        dh = torch.empty(h.shape, dtype=h.dtype)
        sig = s.float().contiguous()
        dg = torch.empty(h.shape[0], dtype=torch.float32)
        native.call(native.library().sanlab_gated_residual_bwd, native.GatedResidualArgs(
            count=h.numel(), d=h.shape[-1], dy=dy.data_ptr(), h=h.data_ptr(), h_bf16=int(h.dtype == torch.bfloat16),
            sigma=0.0, dh=dh.data_ptr(), dg=dg.data_ptr(), nthreads=torch.get_num_threads(),
            group_count=h.numel() // h.shape[0], sigmas=sig.data_ptr()))
        return dy, dh, dg.reshape(s.shape).to(s.dtype)


def member_residual(mode: str, x: torch.Tensor, h: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """`sanlab.model.blocks.residual_update` per member: g (M, 1)."""
    if mode == "gated":
        native_ok = (native.ready(h) and x.dtype == g.dtype == torch.float32 and h.dtype in NATIVE_DTYPES
                     and h.is_contiguous())
        if native_ok and x.is_contiguous() and x.shape == h.shape:
            return _MemberGatedResidual.apply(x, h, g)
        return _PerMember.apply(_NativeGatedResidual if native_ok else _GatedResidual, (True, True, True), x, h, g)
    if mode == "rezero":
        return x + g.to(h.dtype).view(-1, *([1] * (h.dim() - 1))) * h
    if mode == "standard":
        return x + h
    return h


class _BmmLinear(torch.autograd.Function):
    """y = x wᵀ per member (x (M, N, k), w (M, n, k), one dtype) with `F.linear`'s products:
    y and dx = dy w as batched products (equal to the solo ones, bit for bit, measured at
    1 and 2 threads), dW = dyᵀ x as one `mm` per member, the solo backward's own call.
    The BLAS blocks a weight gradient's sum over the rows differently for (xᵀ dy)ᵀ, which
    autograd through bmm(x, wᵀ) forms, and for a batched dyᵀ x at 2 threads: in bf16 1–4
    values of a (128, 64) gradient then round the other way (the demo's QKV product, 2048
    rows), and a member's run drifted from its solo run's from the first step."""

    @staticmethod
    def forward(ctx, x, w):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return torch.bmm(x, w.transpose(1, 2))

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = torch.bmm(dy, w) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = torch.empty(w.shape, dtype=dy.dtype, device=dy.device)
            for m in range(w.shape[0]):
                torch.mm(dy[m].t(), x[m], out=dw[m])
        return dx, dw


def bmm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`F.linear` per member: x (M, ..., k), w (M, n, k) -> (M, ..., n); under autocast in
    its dtype, as `F.linear` (the casts' gradients flow back to x's and w's dtypes)."""
    M, k = x.shape[0], x.shape[-1]
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        x, w = x.to(dt), w.to(dt)
    elif x.dtype != w.dtype:
        dt = torch.promote_types(x.dtype, w.dtype)
        x, w = x.to(dt), w.to(dt)
    with torch.autocast(dev, enabled=False):
        y = _BmmLinear.apply(x.reshape(M, -1, k), w)
    return y.view(*x.shape[:-1], w.shape[1])


# --------------------------------------------------------------------------- the model


class MemberLM(nn.Module):
    """M members of `LM(cfg)` as one batched model (see the module docstring).

    `MemberLM.stack(models)` builds it from solo models (each initialised as its solo run
    would be); `member_state(m)` gives member m's weights back as a solo state dict.
    """

    def __init__(self, cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], n_members: int) -> None:
        super().__init__()
        why = members_unsupported(cfg)
        if why is not None:
            raise ValueError(f"cannot train as members: {why}")
        self.cfg, self.n_members = cfg, n_members
        self.names = list(shapes)
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(n_members, *s)) for s in shapes.values())
        self.by_name = dict(zip(self.names, self.weights))
        self.embed_scale = math.sqrt(cfg.d_model)
        self.zero_centered = cfg.norm == "zcrms"

    @classmethod
    def stack(cls, models: Sequence[LM]) -> MemberLM:
        ref = models[0]
        params = [dict(m.named_parameters()) for m in models]
        member = cls(ref.cfg, {n: tuple(p.shape) for n, p in params[0].items()}, len(models))
        with torch.no_grad():
            for name, w in member.by_name.items():
                torch.stack([p[name].detach() for p in params], out=w.data)
        return member.to(next(ref.parameters()).device)

    def member_state(self, m: int) -> dict[str, torch.Tensor]:
        """Member m's weights, keyed as the solo `LM` keys them (views into the stacks)."""
        return {n: w.detach()[m] for n, w in self.by_name.items()}

    def param_roles(self) -> dict[str, str]:
        """The solo model's roles, by the same names (the optimizer routing reads them)."""
        return self._roles

    def set_roles(self, roles: dict[str, str]) -> None:
        self._roles = {n: roles[n] for n in self.names}

    def _w(self, name: str) -> torch.Tensor:
        return self.by_name[name]

    def _norm(self, name: str, x: torch.Tensor, feeds_matmul: bool) -> torch.Tensor:
        return member_rms_norm(x, self._w(name), self.zero_centered, self.cfg.norm_eps, feeds_matmul)

    def _attention(self, i: int, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        cfg, p = self.cfg, f"blocks.{i}.attn."
        M, B, T, _ = u.shape
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = bmm_linear(u, torch.cat([self._w(p + "wq.weight"), self._w(p + "wk.weight"),
                                       self._w(p + "wv.weight")], dim=1))  # (M, B, T, (H + 2Hkv)D)
        gq, gk = (self._w(p + n).to(torch.float32) for n in ("q_norm.weight", "k_norm.weight"))
        if self.zero_centered:
            gq, gk = 1.0 + gq, 1.0 + gk
        qkv_rows = qkv.view(M * B, T, -1)
        if fused_supported(ctx, D, qkv_rows):
            # the members folded into the batch: one kernel call, each member's B rows with
            # its own QK-norm gains (gain_batches)
            y = qkv_attention(qkv_rows, gq.contiguous(), gk.contiguous(), ctx.cos.contiguous(), ctx.sin.contiguous(),
                              ctx.first_keys(), cfg.norm_eps, H, Hkv, fused_mode(qkv), B)[0].view(M, B, T, H * D)
        else:
            # the other backends (SDPA, FlexAttention, the explicit kernel; a GPU's or a
            # CPU's without the compiled kernels): QK-norm and RoPE per member, then one
            # attention call with the members folded into the batch (M·B rows, the context
            # built for them all)
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
            half = D // 2
            c, s = ctx.cos[..., :half], ctx.sin[..., :half]
            q = member_norm_rope(q.reshape(M, B, T, H, D), gq, cfg.norm_eps, c, s)  # (M·B, H, T, D)
            k = member_norm_rope(k.reshape(M, B, T, Hkv, D), gk, cfg.norm_eps, c, s)
            o = attend(q, k, v.reshape(M * B, T, Hkv, D).transpose(1, 2), ctx)
            y = o.transpose(1, 2).reshape(M, B, T, H * D)
        return bmm_linear(y, self._w(p + "wo.weight"))

    def _ffn(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"blocks.{i}.ffn."
        gate_up = bmm_linear(x, torch.cat([self._w(p + "w_gate.weight"), self._w(p + "w_up.weight")], dim=1))
        return bmm_linear(silu_gate(gate_up), self._w(p + "w_down.weight"))

    def hidden(self, tokens: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
        """tokens, segment_ids (M, B, T) -> the final normalised hidden states (M, B, T, d)."""
        cfg = self.cfg
        M, B, T = tokens.shape
        V = cfg.vocab_size
        rows = tokens.reshape(M * B, T)
        ctx = build_context(cfg, rows, None if segment_ids is None else segment_ids.reshape(M * B, T))
        offsets = (torch.arange(M, device=tokens.device) * V).view(M, 1, 1)
        table = self._w("embed.weight")
        x = F.embedding(tokens + offsets, table.view(M * V, -1)) * self.embed_scale  # (M, B, T, d)
        for i in range(cfg.n_layers):
            b = f"blocks.{i}."
            h = self._attention(i, self._norm(b + "attn_norm.weight", x, True), ctx)
            x = member_residual(cfg.residual, x, h, self.by_name.get(b + "attn_gate"))
            if cfg.ffn:
                h = self._ffn(i, self._norm(b + "ffn_norm.weight", x, True))
                x = member_residual(cfg.residual, x, h, self.by_name.get(b + "ffn_gate"))
        return self._norm("final_norm.weight", x, True)

    def forward(self, tokens: torch.Tensor, segment_ids: torch.Tensor | None, targets: torch.Tensor,
                loss_mask: torch.Tensor, z_loss: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
        """The training loss of each member, as `LM.forward(..., targets=...)` computes it:
        (loss to optimise (M,), cross-entropy (M,)). Members are independent: the sum of
        the losses has each member's own gradient."""
        x = self.hidden(tokens, segment_ids)
        # (unbind: one autograd node stacks the members' gradients; indexing x[m] would have
        # each member's backward fill a zero (M, ...) tensor and autograd add the M of them)
        xs, tables = x.unbind(0), self._w("embed.weight").unbind(0)
        out = [head_loss(xs[m], tables[m], targets[m], loss_mask[m], z_loss) for m in range(self.n_members)]
        return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])


def build_members(cfg: ModelConfig, seeds: Sequence[int], make: Callable[[int], LM] | None = None) -> MemberLM:
    """The members of `cfg` initialised as their solo runs are (`torch.manual_seed(seed)`,
    then `LM(cfg)`), stacked."""
    models = []
    for seed in seeds:
        if make is not None:
            models.append(make(seed))
        else:
            torch.manual_seed(seed)
            models.append(LM(cfg))
    member = MemberLM.stack(models)
    member.set_roles(models[0].param_roles())
    return member
