"""Sequence and state mixers, registered by name (`model.mixer`, `model.state_mixer`).

A sequence mixer maps the normalised residual stream u (B, T, d) to an update (B, T, d)
using an `AttentionContext`; a state mixer (FFN) maps u to an update token by token. A
new variant is one registered class (docs/architecture.md, design rules) that declares, besides its
forward pass:

- `Options`: its own typed options (`model.mixer_options`), a `StrictModel`;
- `param_terms(cfg, opts)`: its parameters by name (relative to the module) and size;
- `flop_terms(cfg, opts, seq_len, causal_half)`: its forward FLOPs per token, as named
  terms (a multiply-add counts 2; only matrix products, as SPEC §1.2 counts);
- `param_roles()`: the role of each parameter (`ROLES`), which the optimizer routing reads;
- `reset_parameters(std, out_std)`: its own init (`out_std` for matrices that write into
  the residual stream, SPEC §1.1); fixed random state is a buffer and is never re-drawn;
- `freezable`: the `train.freeze` targets it has (`qk`, `mlp`) and their parameters.

`sanlab.accounting` sums the terms over the layer layout; the registry-driven tests hold
every registered class's terms against its module (parameters by name, FLOPs against
FlopCounterMode), so a variant registered with wrong accounting fails the suite.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from sanlab.config import ModelConfig, StrictModel, validate
from sanlab.errors import ConfigError
from sanlab.model.kernels import attend, fused_qkv_attention, norm_rope, silu_gate
from sanlab.model.layers import AttentionContext, HookPoint, RMSNorm, apply_rope, make_norm, upcast

# What a parameter is, for the optimizer routing (sanlab.train.optim) and the spectra:
#   routing  a matrix that decides where information flows (W_q, W_k)
#   content  a matrix that carries the information (W_v, W_o, FFN matrices)
#   table    an embedding-like lookup table
#   gain     a norm gain;  gate  a residual scalar
#   frozen   kept at its initialisation (no gradient, no optimizer state)
Role = Literal["routing", "content", "table", "gain", "gate", "frozen"]
ROLES: tuple[Role, ...] = ("routing", "content", "table", "gain", "gate", "frozen")


class NoOptions(StrictModel):
    """A mixer without options: any `model.mixer_options` key is unknown."""


class Mixer(nn.Module):
    """The declarations every registered mixer makes (see the module docstring)."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[StrictModel]] = NoOptions
    freezable: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        raise NotImplementedError

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        raise NotImplementedError

    def param_roles(self) -> dict[str, Role]:
        raise NotImplementedError

    def reset_parameters(self, std: float, out_std: float) -> None:
        raise NotImplementedError


class SequenceMixer(Mixer):
    """A token mixer. `has_pattern`: it exposes `self.pattern`, a HookPoint that sees its
    (B, H, T, T) mixing weights (`blocks.{i}.attn.pattern`) when someone captures it."""

    short: ClassVar[str] = ""  # its name in labels and run ids (`hyb-nonapprox-…`)
    has_pattern: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.opts = opts


class StateMixer(Mixer):
    """A token-local mixer (FFN) of width `cfg.ffn_dim`."""

    def __init__(self, cfg: ModelConfig, opts: Any) -> None:
        super().__init__()
        self.opts = opts


MIXERS: dict[str, type[SequenceMixer]] = {}
STATE_MIXERS: dict[str, type[StateMixer]] = {}


def _register(registry: dict, name: str, kind: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in registry:
            raise ValueError(f"{kind} {name!r} registered twice")
        cls.name = name
        registry[name] = cls
        return cls

    return wrap


def register_mixer(name: str, short: str | None = None) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        cls.short = short or name
        return _register(MIXERS, name, "sequence mixer")(cls)

    return wrap


def register_state_mixer(name: str) -> Callable[[type], type]:
    return _register(STATE_MIXERS, name, "state mixer")


def mixer_class(name: str) -> type[SequenceMixer]:
    cls = MIXERS.get(name)
    if cls is None:
        raise ConfigError(f"model.mixer: unknown sequence mixer {name!r} (known: {', '.join(MIXERS)})")
    return cls


def state_mixer_class(name: str) -> type[StateMixer]:
    cls = STATE_MIXERS.get(name)
    if cls is None:
        raise ConfigError(f"model.state_mixer: unknown state mixer {name!r} (known: none, {', '.join(STATE_MIXERS)})")
    return cls


def mixer_options(cfg: ModelConfig, name: str) -> Any:
    """The validated options of mixer `name` in `cfg`: `model.mixer_options` belong to
    `model.mixer`; any other mixer of the layout (softmax in a hybrid) gets its defaults."""
    cls = mixer_class(name)
    raw = cfg.mixer_options if name == cfg.mixer else {}
    return validate(cls.Options, raw, source=f"model.mixer_options (mixer {name})")


def check_model(cfg: ModelConfig) -> None:
    """Every name in the layout, the state mixer and the mixer options are registered and
    valid (ConfigError naming the key otherwise). Config validation cannot do this without
    importing the model; building and accounting call it."""
    mixer_class(cfg.mixer)
    for name in dict.fromkeys(cfg.layer_mixers):
        mixer_options(cfg, name)
    if cfg.mixer not in cfg.layer_mixers:
        mixer_options(cfg, cfg.mixer)  # options given for a mixer the layout does not use: still checked
    if cfg.state_mixer != "none":
        state_mixer_class(cfg.state_mixer)


def build_mixer(cfg: ModelConfig, layer_idx: int) -> SequenceMixer:
    name = cfg.layer_mixers[layer_idx]
    return mixer_class(name)(cfg, layer_idx, mixer_options(cfg, name))


def attention_terms(cfg: ModelConfig, seq_len: int, causal_half: bool, products: int = 2) -> int:
    """FLOPs per token of one pairwise product over the sequence (q·kᵀ or A·v), all heads:
    2·T·H·d_h for the full square, half that for the causal half (SPEC §1.2)."""
    square = 2 * seq_len * cfg.n_heads * cfg.head_dim
    return square // 2 if causal_half else square


def _normal(p: torch.Tensor, std: float) -> None:
    nn.init.normal_(p, 0.0, std)


# The gated MLP W_down(SiLU(W_gate x) ⊙ W_up x), shared by the SwiGLU state mixer and the
# `mlp` sequence mixer (SPEC §3's token-local replacement of attention).
def _swiglu_roles() -> dict[str, Role]:
    return {"w_gate.weight": "content", "w_up.weight": "content", "w_down.weight": "content"}


def _swiglu_init(m: nn.Module, std: float, out_std: float) -> None:
    _normal(m.w_gate.weight, std)
    _normal(m.w_up.weight, std)
    _normal(m.w_down.weight, out_std)  # writes into the residual stream


def _swiglu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # gate and up as one product: x is read and cast once, dL/dx is one matmul
    gate_up = F.linear(x, torch.cat([m.w_gate.weight, m.w_up.weight]))
    return m.w_down(silu_gate(gate_up))


# --------------------------------------------------------------------------- softmax


@register_mixer("softmax", short="softmax")
class SoftmaxAttention(SequenceMixer):
    """Grouped-query softmax attention with per-head QK-norm then RoPE (SPEC §1.1).

    q, k = RoPE(ZCN_h(W_q u)), RoPE(ZCN_h(W_k u)); one gain vector of size head_dim
    per q and per k, shared by all heads; A = softmax(q kᵀ/√d_h + M); out = W_o(A v).
    """

    has_pattern = True
    freezable = {"qk": ("wq.weight", "wk.weight")}

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.wq = nn.Linear(d, H * D, bias=False)
        self.wk = nn.Linear(d, Hkv * D, bias=False)
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        self.q_norm = make_norm(cfg, D) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, D) if cfg.qk_norm else None
        self.pattern = HookPoint()

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        d, dh = cfg.d_model, cfg.head_dim
        p = {
            "wq.weight": d * cfg.n_heads * dh,
            "wk.weight": d * cfg.n_kv_heads * dh,
            "wv.weight": d * cfg.n_kv_heads * dh,
            "wo.weight": cfg.n_heads * dh * d,
        }
        if cfg.qk_norm:
            # One gain vector of size head_dim shared by all heads, for q and for k (SPEC §1.1).
            p["q_norm.weight"] = dh
            p["k_norm.weight"] = dh
        return p

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        weights = sum(v for k, v in cls.param_terms(cfg, opts).items() if k.startswith("w"))
        mix = attention_terms(cfg, seq_len, causal_half)
        return {"attn_proj": 2 * weights, "attn_scores": mix, "attn_mix": mix}

    def param_roles(self) -> dict[str, Role]:
        roles: dict[str, Role] = {"wq.weight": "routing", "wk.weight": "routing",
                                  "wv.weight": "content", "wo.weight": "content"}
        if self.q_norm is not None:
            roles |= {"q_norm.weight": "gain", "k_norm.weight": "gain"}
        return roles

    def reset_parameters(self, std: float, out_std: float) -> None:
        for w in (self.wq, self.wk, self.wv):
            _normal(w.weight, std)
        _normal(self.wo.weight, out_std)
        for n in (self.q_norm, self.k_norm):
            if n is not None:
                n.reset_parameters()

    @staticmethod
    def _norm_rope(x: torch.Tensor, norm: RMSNorm | None, ctx: AttentionContext) -> torch.Tensor:
        """Per-head QK-norm THEN RoPE, both in fp32. (B, T, h, D) -> fp32, laid out as
        (B, h, T, D) a transpose away; `attend` casts it to what its backend needs."""
        if norm is not None:
            half = x.shape[-1] // 2
            return norm_rope(x, norm.gain(torch.promote_types(x.dtype, torch.float32)), norm.eps,
                             ctx.cos[..., :half], ctx.sin[..., :half])
        return apply_rope(upcast(x), ctx.cos, ctx.sin)

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """What Q and K are computed from: the current hidden state (the variants below
        override this)."""
        return u

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        src = self.qk_source(u, ctx)
        if src is u:
            # One product for Q, K and V (three parameters, so Muon still sees each matrix):
            # u is read and cast once, and dL/du is a single fp32-accumulated matmul.
            qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
            if self.q_norm is not None and self.k_norm is not None and self.q_norm.eps == self.k_norm.eps:
                # QK-norm, RoPE and attention from the product in one kernel where it runs
                g32 = torch.promote_types(qkv.dtype, torch.float32)
                y = fused_qkv_attention(qkv, H, Hkv, self.q_norm.gain(g32), self.k_norm.gain(g32), self.q_norm.eps,
                                        ctx, self.pattern)
                if y is not None:
                    return self.wo(y)
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        else:
            qk = F.linear(src, torch.cat([self.wq.weight, self.wk.weight]))
            q, k = qk.split([H * D, Hkv * D], dim=-1)
            v = self.wv(u)  # V always from the current hidden state
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        q, k = self._norm_rope(q, self.q_norm, ctx), self._norm_rope(k, self.k_norm, ctx)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), ctx, self.pattern)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


# --------------------------------------------------------------------------- SPEC §3 variants


@register_mixer("static_emb_qk", short="staticqk")
class StaticEmbQK(SoftmaxAttention):
    """SPEC §3 StaticEmbQK: Q and K from the static input token embeddings (the scaled
    embedding entering block 0, RMS-normalised without a gain) instead of the current
    hidden state; V from the current hidden state. Same parameters as softmax attention."""

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.embedded is None:
            raise RuntimeError("static_emb_qk needs the input embeddings in the attention context")
        return ctx.static_qk_input(u.dtype)


class _StreamOptions(StrictModel):
    seed: int = 0  # the fixed input sequence is drawn from this seed


class _StreamQK(SoftmaxAttention):
    """Q and K from the hidden states of a fixed input sequence passed through the layers
    (SPEC §3 RndEmbQK / FixedSeqQK). `LM.forward` first runs the blocks on the fixed
    sequence (one row, positions 0…T−1, as a plain model: there each such layer's Q and K
    come from its own input) and records each layer's normalised input; the real batch
    then reads Q and K of the token at document position p from the fixed stream at
    position p (so a packed row gives each document what it would get alone), V from
    its own hidden state. The fixed pass is one extra row per step and is trained through."""

    Options = _StreamOptions
    uses_qk_stream: ClassVar[bool] = True

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if ctx.qk_stream is None:  # the fixed pass itself: record this layer's input
            ctx.qk_record[self.layer_idx] = u
            return u
        fixed = ctx.qk_stream[self.layer_idx]  # (1, T, d)
        return fixed[0][ctx.positions].to(u.dtype)  # (B, T, d), by position within the document

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        raise NotImplementedError


@register_mixer("rnd_emb_qk", short="rndqk")
class RndEmbQK(_StreamQK):
    """SPEC §3 RndEmbQK: the fixed sequence is random embeddings, N(0, init_std)·√d like
    the initial token embeddings, drawn from `seed` (input-independent Q/K maps)."""

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.opts.seed)
        x = torch.randn(1, T, cfg.d_model, generator=g) * (cfg.init_std * scale)
        return x.to(device=device, dtype=embed.weight.dtype)


@register_mixer("fixed_seq_qk", short="fixedqk")
class FixedSeqQK(_StreamQK):
    """SPEC §3 FixedSeqQK: the fixed sequence is one token sequence, embedded by the model's
    own (trained) embedding. The model does not read data, so the sequence is drawn from
    `seed` uniformly over the non-special ids (8 … vocab−1)."""

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.opts.seed)
        low = 8 if cfg.vocab_size > 8 else 0
        tokens = torch.randint(low, cfg.vocab_size, (1, T), generator=g).to(device)
        return embed(tokens) * scale


@register_mixer("non_approximate", short="nonapprox")
class NonApproximate(SoftmaxAttention):
    """SPEC §3 Non-approximate: no pairwise similarity. q = SiLU(W_q u), k = W_k u (per-head
    QK-norm if on, no RoPE: a score of one position has no relative offset), and
    A_ij = softmax_{j ≤ i}(q_j · k_j / √d_h): each key's weight is independent of the query
    position, so row i is a running softmax average of v over the document so far.

    Computed by the attention kernels with a query e₀ and a key s_j·√d_h·e₀ (heads as wide
    as V's, so every backend takes them), so document masking and the pattern hook are
    those of softmax attention. Same parameters as softmax attention; FLOPs: the
    projections, the per-position score (2·H·d_h) and A·v."""

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        """The products that run: projections, the kernel's score product (a d_h-wide head,
        so the same count as softmax attention's q·kᵀ) and A·v. The per-position score
        q_j·k_j is elementwise (2·H·d_h) and, like norms, not counted."""
        weights = sum(v for k, v in cls.param_terms(cfg, opts).items() if k.startswith("w"))
        mix = attention_terms(cfg, seq_len, causal_half)
        return {"attn_proj": 2 * weights, "attn_scores": mix, "attn_mix": mix}

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = F.silu(upcast(q)).view(B, T, H, D)
        k = upcast(k).view(B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm.normalize(q), self.k_norm.normalize(k)
        rep = H // Hkv
        # s_j = q_j · k_j / √d_h per query head (the KV head of its group)
        s = torch.linalg.vecdot(q, k.repeat_interleave(rep, dim=2)) * D**-0.5  # (B, T, H)
        qq = s.new_zeros(B, H, T, D)
        qq[..., 0] = 1.0
        kk = s.new_zeros(B, H, T, D)
        kk[..., 0] = s.transpose(1, 2) * D**0.5  # the kernel divides by √D
        vv = v.view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(rep, dim=1)  # (B, H, T, D)
        y = attend(qq, kk, vv, ctx, self.pattern)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))


class _TaylorOptions(StrictModel):
    chunk: int = Field(64, gt=0)  # query/key rows per block of the linear-time computation


@register_mixer("approximate", short="approx")
class TaylorAttention(SoftmaxAttention):
    """SPEC §3 Approximate: softmax's exp replaced by its 2nd-order Taylor expansion,
    w_ij = 1 + s_ij + s_ij²/2 with s_ij = q_i·k_j/√d_h (> 0 for every s), causal and
    normalised: A_ij = w_ij / Σ_{j' ≤ i} w_ij'. Q/K as softmax attention (QK-norm, RoPE).

    Linear time in T: with φ(x) = [1, x, vec(x xᵀ)/√2] and x scaled by d_h^-¼,
    w_ij = φ(q_i)·φ(k_j), so the keys before a block enter through the running sums
    S = Σ φ(k_j) v_jᵀ (F × d_h, F = 1 + d_h + d_h²) and z = Σ φ(k_j); inside a block of
    `chunk` rows the weights are computed directly. The running sums restart at every
    document start (a packed row equals each document alone). No T×T tensor is formed
    unless the pattern hook is captured (then A is materialised for analysis)."""

    Options = _TaylorOptions

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        """Exact for the blocked computation at row length T (`causal_half` does not apply:
        each block is computed whole). attn_block: q·kᵀ and w·v inside each block;
        attn_state: φ(q)·[S | z] for the queries of every block but the first, and the
        update φ(k)ᵀ v for the keys of every block but the last (F = 1 + d_h + d_h²)."""
        weights = sum(v for k, v in cls.param_terms(cfg, opts).items() if k.startswith("w"))
        D, H, T = cfg.head_dim, cfg.n_heads, seq_len
        blocks = [min(opts.chunk, T - s) for s in range(0, T, opts.chunk)]
        feat = 1 + D + D * D
        state = (T - blocks[0]) * 2 * feat * (D + 1) + (T - blocks[-1]) * 2 * feat * D
        return {"attn_proj": 2 * weights,
                "attn_block": 2 * 2 * D * H * sum(c * c for c in blocks) // T,
                "attn_state": H * state // T}

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k = q.view(B, T, H, D), k.view(B, T, Hkv, D)
        q, k = self._norm_rope(q, self.q_norm, ctx), self._norm_rope(k, self.k_norm, ctx)
        rep = H // Hkv
        q = q.transpose(1, 2)  # (B, H, T, D) fp32
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = upcast(v.view(B, T, Hkv, D)).transpose(1, 2).repeat_interleave(rep, dim=1)
        with torch.autocast(u.device.type, enabled=False):  # the weights and sums in fp32
            if self.pattern.active:
                A = taylor_weights(q, k, ctx.dense_mask)
                y = self.pattern(A) @ v
            else:
                y = taylor_attention(q, k, v, ctx.segment_ids, self.opts.chunk)
        return self.wo(y.to(u.dtype).transpose(1, 2).reshape(B, T, H * D))


def taylor_weights(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The explicit quadratic formula: A_ij = w_ij / Σ_j w_ij over allowed j, with
    w = 1 + s + s²/2, s = q kᵀ/√D. q, k (B, H, T, D); allowed (B, 1, T, T) -> (B, H, T, T)."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    w = (1 + s + 0.5 * s * s) * allowed
    return w / w.sum(-1, keepdim=True)


def _features(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = [1, x, vec(x xᵀ)/√2] for x already scaled by D^-¼. (…, D) -> (…, 1 + D + D²)."""
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2) * 0.5**0.5
    return torch.cat([torch.ones_like(x[..., :1]), x, outer], dim=-1)


def taylor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_ids: torch.Tensor,
                     chunk: int) -> torch.Tensor:
    """Causal, document-masked, normalised 2nd-order Taylor attention in linear time.

    q, k, v (B, H, T, D) fp32; segment_ids (B, T). Blocks of `chunk` rows: inside a block
    the weights are computed directly under the causal and document mask; keys of earlier
    blocks enter through the running sums (S, z) of the document active at the block's
    start, which restart when a document starts inside a block."""
    B, H, T, D = q.shape
    scale = D**-0.25
    qs, ks = q * scale, k * scale
    out = torch.empty_like(v)
    S = q.new_zeros(B, H, 1 + D + D * D, D)
    z = q.new_zeros(B, H, 1 + D + D * D)
    prev_seg = None  # (B,) segment id of the token before the block
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        seg = segment_ids[:, s:e]  # (B, C)
        qb, kb, vb = qs[:, :, s:e], ks[:, :, s:e], v[:, :, s:e]
        sc = qb @ kb.transpose(-1, -2)  # (B, H, C, C), = q·k/√D
        causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal  # (B, C, C)
        w = (1 + sc + 0.5 * sc * sc) * allowed[:, None]
        num, den = w @ vb, w.sum(-1)
        if prev_seg is not None:
            fq = _features(qb)  # (B, H, C, F)
            carried = (seg == prev_seg[:, None])[:, None, :]  # (B, 1, C): queries of the carried document
            num = num + (fq @ S) * carried[..., None]
            den = den + (fq @ z[..., None]).squeeze(-1) * carried
        out[:, :, s:e] = num / den[..., None]
        if e < T:
            # keys of the document active at the block's end; keep S only if it continues
            last = seg[:, -1]
            tail = (seg == last[:, None]).to(q.dtype)[:, None, :, None]  # (B, 1, C, 1)
            fk = _features(kb) * tail
            keep = (seg[:, 0] == last) & (prev_seg == last if prev_seg is not None else torch.ones_like(last, dtype=torch.bool))
            keep = keep.to(q.dtype)[:, None, None]
            S = S * keep[..., None] + fk.transpose(-1, -2) @ vb
            z = z * keep + fk.sum(-2)
            prev_seg = last
    return out


@register_mixer("mlp", short="mlp")
class MLPMixer(SequenceMixer):
    """SPEC §3 MLP: attention replaced by a token-local gated MLP, O = W_dn(SiLU(W_gt u) ⊙ W_up u),
    with the parameter count of the attention it replaces: hidden width
    (W_q + W_k + W_v + W_o weights) / (3·d) (= d under 8:4 GQA; `d_hidden` overrides).
    No cross-token interaction at all (so no pattern)."""

    class Options(StrictModel):
        d_hidden: int | None = Field(None, gt=0)

    freezable = {"mlp": ("w_gate.weight", "w_up.weight", "w_down.weight")}

    @staticmethod
    def hidden(cfg: ModelConfig, opts: Any) -> int:
        if opts.d_hidden is not None:
            return opts.d_hidden
        d, dh = cfg.d_model, cfg.head_dim
        attn = 2 * d * cfg.n_heads * dh + 2 * d * cfg.n_kv_heads * dh
        return max(1, attn // (3 * d))

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        f = self.hidden(cfg, opts)
        self.w_gate = nn.Linear(cfg.d_model, f, bias=False)
        self.w_up = nn.Linear(cfg.d_model, f, bias=False)
        self.w_down = nn.Linear(f, cfg.d_model, bias=False)

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        f, d = cls.hidden(cfg, opts), cfg.d_model
        return {"w_gate.weight": d * f, "w_up.weight": d * f, "w_down.weight": f * d}

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"attn_proj": 2 * sum(cls.param_terms(cfg, opts).values())}

    def param_roles(self) -> dict[str, Role]:
        return _swiglu_roles()

    def reset_parameters(self, std: float, out_std: float) -> None:
        _swiglu_init(self, std, out_std)

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return _swiglu(self, u)


# --------------------------------------------------------------------------- SPEC §2 MixiT


class _MixiTOptions(StrictModel):
    seed: int = 0  # the matrices are drawn from this seed (and the layer index)
    seq_len: int = Field(256, gt=0)  # the row length T the matrices are built for (σ_h depends on it)
    sink_head: bool = True  # head 0 is the sink head (½I + ½ on column 0)


def mixit_matrices(n_heads: int, T: int, head_dim: int, seed: int, sink_head: bool = True) -> torch.Tensor:
    """SPEC §2's fixed random causal mixing matrices, (H, T, T) fp32.

    Per head h: σ_h = 1/√(T·d_h) + U(0,1)·(1/√T − 1/√(T·d_h)); N ~ Normal(0, σ_h²),
    N ← tril(N); subtract each row's mean over its causal support (so the noise rows are
    centred); A = tril(I + N − drift): rows sum to 1. Head 0 (with `sink_head`) is ½I
    plus ½ on column 0."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n_heads, generator=g, dtype=torch.float64)
    sigma = 1 / math.sqrt(T * head_dim) + u * (1 / math.sqrt(T) - 1 / math.sqrt(T * head_dim))  # (H,)
    N = torch.randn(n_heads, T, T, generator=g, dtype=torch.float64) * sigma[:, None, None]
    N = N.tril()
    support = torch.arange(1, T + 1, dtype=torch.float64)[:, None]  # row i has i+1 causal entries
    drift = N.sum(-1, keepdim=True) / support
    A = (torch.eye(T, dtype=torch.float64) + N - drift).tril()
    if sink_head:
        sink = 0.5 * torch.eye(T, dtype=torch.float64)
        sink[:, 0] += 0.5
        A[0] = sink
    return A.float()


@register_mixer("mixit", short="mixit")
class MixiT(SequenceMixer):
    """SPEC §2 MixiT: no Q/K and no RoPE; each head mixes values with a fixed random,
    input-independent causal matrix (`mixit_matrices`), out = W_o(A v). The matrices are a
    persistent buffer (`mixing`, saved in checkpoints, never trained or re-drawn). In a
    packed row token at document position p mixes the tokens of its document with
    A[p, p'] (so each document gets what it would alone; rows still sum to 1)."""

    Options = _MixiTOptions
    has_pattern = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        self.register_buffer("mixing", mixit_matrices(H, opts.seq_len, D, opts.seed * 1_000_003 + layer_idx,
                                                      opts.sink_head))
        self.pattern = HookPoint()

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        d, dh = cfg.d_model, cfg.head_dim
        return {"wv.weight": d * cfg.n_kv_heads * dh, "wo.weight": cfg.n_heads * dh * d}

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"attn_proj": 2 * sum(cls.param_terms(cfg, opts).values()),
                "attn_mix": attention_terms(cfg, seq_len, causal_half)}

    def param_roles(self) -> dict[str, Role]:
        return {"wv.weight": "content", "wo.weight": "content"}

    def reset_parameters(self, std: float, out_std: float) -> None:
        _normal(self.wv.weight, std)
        _normal(self.wo.weight, out_std)

    def weights(self, ctx: AttentionContext, T: int) -> torch.Tensor:
        """The mixing weights of this batch: (1 or B, H, T, T), zero across documents."""
        if T > self.mixing.shape[-1]:
            raise ConfigError(f"mixit: rows of {T} tokens, but its matrices are built for "
                              f"model.mixer_options.seq_len={self.mixing.shape[-1]}")
        if ctx.single_document:
            return self.mixing[None, :, :T, :T]
        pos = ctx.positions  # (B, T)
        A = self.mixing[:, pos[:, :, None], pos[:, None, :]]  # (H, B, T, T)
        return A.transpose(0, 1) * ctx.dense_mask

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        v = self.wv(u).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
        A = self.pattern(self.weights(ctx, T).to(v.dtype))
        y = A @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))


# --------------------------------------------------------------------------- state mixers


@register_state_mixer("swiglu")
class SwiGLU(StateMixer):
    """W_down(SiLU(W_gate x) ⊙ W_up x), no biases (SPEC §1.1 control arm)."""

    freezable = {"mlp": ("w_gate.weight", "w_up.weight", "w_down.weight")}

    def __init__(self, cfg: ModelConfig, opts: Any) -> None:
        super().__init__(cfg, opts)
        d, f = cfg.d_model, cfg.ffn_dim
        self.w_gate = nn.Linear(d, f, bias=False)
        self.w_up = nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)

    @classmethod
    def param_terms(cls, cfg: ModelConfig, opts: Any) -> dict[str, int]:
        d, f = cfg.d_model, cfg.ffn_dim
        return {"w_gate.weight": d * f, "w_up.weight": d * f, "w_down.weight": f * d}

    @classmethod
    def flop_terms(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        return {"ffn": 2 * 3 * cfg.d_model * cfg.ffn_dim}

    def param_roles(self) -> dict[str, Role]:
        return _swiglu_roles()

    def reset_parameters(self, std: float, out_std: float) -> None:
        _swiglu_init(self, std, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _swiglu(self, x)


def build_state_mixer(cfg: ModelConfig) -> StateMixer:
    return state_mixer_class(cfg.state_mixer)(cfg, NoOptions())
