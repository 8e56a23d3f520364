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
- `freezable`: the `train.freeze` targets it has (`qk`, `qk_proj`, `mlp`) and their
  parameters (a name the module does not have, such as a QK-norm gain with QK-norm off,
  is skipped: `frozen_names`);
- `bind_data(heldout, seq_len)`: state taken from the data before training (FixedSeqQK's sequence);
  most mixers take none.

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
from sanlab.errors import ConfigError, DataError
from sanlab.model.attention import AttentionContext, attend, fused_qkv_attention
from sanlab.model.kernels import silu_gate
from sanlab.model.layers import HookPoint, RMSNorm, apply_rope, make_norm, upcast
from sanlab.model.norms import norm_rope

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

    def frozen_names(self, target: str) -> tuple[str, ...]:
        """The parameters `train.freeze=[target]` keeps at init: the declared ones this module has."""
        have = dict(self.named_parameters())
        return tuple(n for n in self.freezable.get(target, ()) if n in have)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        """Before training on rows of `seq_len` tokens: take what the mixer needs from the
        data (`heldout(n)`: the first n tokens of the held-out split, fewer if it has fewer;
        `sanlab.data.shards.heldout_tokens`), and refuse a row length it cannot serve."""


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
    # Frozen-QK (SPEC §2) keeps everything that shapes the scores from content at init: W_q,
    # W_k and the QK-norm gains (a trainable per-dimension weighting and temperature of the
    # scores otherwise). `qk_proj` is the narrower freeze of W_q, W_k alone.
    freezable = {"qk": ("wq.weight", "wk.weight", "q_norm.weight", "k_norm.weight"),
                 "qk_proj": ("wq.weight", "wk.weight")}

    @classmethod
    def has_qk_norm(cls, cfg: ModelConfig, opts: Any) -> bool:
        """Whether q and k are normalised per head: `model.qk_norm` (a variant may decide otherwise)."""
        return cfg.qk_norm

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.wq = nn.Linear(d, H * D, bias=False)
        self.wk = nn.Linear(d, Hkv * D, bias=False)
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        qk_norm = self.has_qk_norm(cfg, opts)
        self.q_norm = make_norm(cfg, D) if qk_norm else None
        self.k_norm = make_norm(cfg, D) if qk_norm else None
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
        if cls.has_qk_norm(cfg, opts):
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


class _FixedSeqOptions(StrictModel):
    # data: the first held-out tokens of data.dir (real text, SPEC §3; the trainer binds them);
    # random: token ids drawn from `seed` uniformly over the non-special ids (8 … vocab−1)
    sequence: Literal["data", "random"] = "data"
    seed: int = 0  # the draw of sequence="random"
    seq_len: int = Field(256, gt=0)  # tokens the fixed sequence holds: the longest row it serves


UNSET = -1  # a token id of FixedSeqQK's sequence not taken from data (yet)


@register_mixer("fixed_seq_qk", short="fixedqk")
class FixedSeqQK(_StreamQK):
    """SPEC §3 FixedSeqQK: the fixed sequence is one real token sequence, embedded by the
    model's own (trained) embedding: the first `seq_len` tokens of the held-out split of
    `data.dir`, i.e. its first document ([BOS] … [EOS]), cut at `seq_len` when longer and
    followed by the next held-out documents when shorter, passed through the layers as one
    sequence. A row of T tokens reads its first T.

    The ids are a persistent buffer (`tokens`, saved in checkpoints, never trained). A model
    built without data holds no sequence (every id `UNSET`): accounting, matching and
    building work, a forward pass is an error until `bind_data` (the trainer, from
    `data.dir`) or a checkpoint fills it. `sequence="random"` draws the ids from `seed`
    instead (the construction before real data was used)."""

    Options = _FixedSeqOptions

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        if opts.sequence == "random":
            g = torch.Generator().manual_seed(opts.seed)
            low = 8 if cfg.vocab_size > 8 else 0
            tokens = torch.randint(low, cfg.vocab_size, (opts.seq_len,), generator=g)
        else:
            tokens = torch.full((opts.seq_len,), UNSET, dtype=torch.long)
        self.register_buffer("tokens", tokens)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        if seq_len > self.opts.seq_len:
            raise ConfigError(f"fixed_seq_qk: rows of {seq_len} tokens, but its fixed sequence holds "
                              f"model.mixer_options.seq_len={self.opts.seq_len}")
        if self.opts.sequence != "data":
            return
        ids = heldout(self.opts.seq_len).to(self.tokens)
        if len(ids) < seq_len:
            raise DataError(f"fixed_seq_qk: the held-out split holds {len(ids)} tokens, fewer than the "
                            f"rows of {seq_len} its fixed sequence must cover")
        self.tokens.fill_(UNSET)
        self.tokens[: len(ids)] = ids

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        tokens = self.tokens[:T]
        if T > len(self.tokens) or bool((tokens == UNSET).any()):
            have = int((self.tokens != UNSET).sum())
            if have == 0:
                raise ConfigError("fixed_seq_qk: no fixed sequence (a model built without data: training "
                                  "binds it from data.dir's held-out split, a checkpoint restores it; "
                                  "model.mixer_options.sequence=random draws ids instead)")
            raise ConfigError(f"fixed_seq_qk: rows of {T} tokens, but its fixed sequence holds {have}")
        return embed(tokens[None].to(device)) * scale


class _NonApproximateOptions(StrictModel):
    # Per-head QK-norm of SiLU(q) and k. Off by default: SPEC §3's scores are unbounded (the
    # paper's model has no QK-norm); `model.qk_norm` does not decide it for this mixer.
    qk_norm: bool = False


@register_mixer("non_approximate", short="nonapprox")
class NonApproximate(SoftmaxAttention):
    """SPEC §3 Non-approximate: no pairwise similarity. q = SiLU(W_q u), k = W_k u (no RoPE:
    a score of one position has no relative offset), and
    A_ij = softmax_{j ≤ i}(q_j · k_j / √d_h): each key's weight is independent of the query
    position, so row i is a running softmax average of v over the document so far. No
    QK-norm unless `mixer_options.qk_norm` turns it on (then SiLU(q) and k are normalised
    per head, with gains, before the score).

    Computed by the attention kernels with a query e₀ and a key s_j·√d_h·e₀ (heads as wide
    as V's, so every backend takes them), so document masking and the pattern hook are
    those of softmax attention. Same parameters as softmax attention (the q/k gains only
    with its QK-norm); FLOPs: the projections, the per-position score (2·H·d_h) and A·v."""

    Options = _NonApproximateOptions

    @classmethod
    def has_qk_norm(cls, cfg: ModelConfig, opts: Any) -> bool:
        return opts.qk_norm

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

# What sets T in σ_h for the rows of a document (docs/variants.md, "MixiT"):
#   document  the document's own length L: each document is mixed by SPEC §2's matrix for a
#             sequence of L tokens (the paper's form; the default)
#   prefix    row i (document position i) by σ_h(i + 1), the number of tokens it mixes: the
#             weights never depend on the document's length, so decoding is exact
#   row       a fixed T = `seq_len` for every row (the construction before the document length
#             was used: a short document only sees the top-left block of a matrix built for T)
SigmaLength = Literal["document", "prefix", "row"]


class _MixiTOptions(StrictModel):
    seed: int = 0  # the fixed draw comes from this seed (and the layer index)
    seq_len: int = Field(256, gt=0)  # the longest document the draw covers (and T for sigma_length="row")
    sigma_length: SigmaLength = "document"  # what sets T in σ_h (see above)
    sink_head: bool = True  # head 0 is the sink head (½I + ½ on column 0)


def mixit_seed(seed: int, layer_idx: int) -> int:
    """The seed of layer `layer_idx`'s draw: every layer has its own matrices."""
    return seed * 1_000_003 + layer_idx


def mixit_draw(n_heads: int, T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed random state of SPEC §2's construction, float64: u (H,) ~ U(0,1) (σ_h's
    mixing coefficient) and C (H, T, T), standard normals on and below the diagonal with
    each row's mean over its causal support subtracted (so N − drift = σ_h · C).

    Drawn row by row (row i: H·(i+1) normals), so the draw for T is the top-left block of
    the draw for any longer T: the matrices of a document of L tokens are the same
    whatever `seq_len` the draw was made for."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n_heads, generator=g, dtype=torch.float64)
    Z = torch.zeros(n_heads, T, T, dtype=torch.float64)
    for i in range(T):
        Z[:, i, : i + 1] = torch.randn(n_heads, i + 1, generator=g, dtype=torch.float64)
    support = torch.arange(1, T + 1, dtype=torch.float64)[:, None]  # row i has i+1 causal entries
    C = (Z - Z.sum(-1, keepdim=True) / support).tril()
    return u, C


def mixit_sigma(u: torch.Tensor, T: torch.Tensor | int, head_dim: int) -> torch.Tensor:
    """σ_h = 1/√(T·d_h) + u_h·(1/√T − 1/√(T·d_h)) (SPEC §2), broadcast over u and T."""
    T = torch.as_tensor(T, dtype=u.dtype, device=u.device)
    low = (T * head_dim) ** -0.5
    return low + u * (T**-0.5 - low)


def mixit_matrices(n_heads: int, T: int, head_dim: int, seed: int, sink_head: bool = True,
                   sigma_length: SigmaLength = "document", seq_len: int | None = None) -> torch.Tensor:
    """SPEC §2's fixed random causal mixing matrices of one sequence of T tokens, (H, T, T) fp32.

    Per head h: N ~ Normal(0, σ_h²), N ← tril(N); subtract each row's mean over its causal
    support (so the noise rows are centred); A = tril(I + N − drift): rows sum to 1. With
    `sigma_length="document"` σ_h is σ_h(T) in every row (SPEC §2: T the length of the
    sequence mixed); "prefix": row i uses σ_h(i + 1); "row": σ_h(seq_len). Head 0 (with
    `sink_head`) is ½I plus ½ on column 0."""
    u, C = mixit_draw(n_heads, T, seed)
    if sigma_length == "document":
        sigma = mixit_sigma(u, T, head_dim)[:, None, None]  # (H, 1, 1)
    elif sigma_length == "prefix":
        sigma = mixit_sigma(u[:, None], torch.arange(1, T + 1, dtype=torch.float64), head_dim)[:, :, None]
    else:
        if seq_len is None:
            raise ValueError("sigma_length='row' needs the seq_len the matrices are built for")
        sigma = mixit_sigma(u, seq_len, head_dim)[:, None, None]
    A = torch.eye(T, dtype=torch.float64) + sigma * C
    if sink_head:
        sink = 0.5 * torch.eye(T, dtype=torch.float64)
        sink[:, 0] += 0.5
        A[0] = sink
    return A.float()


@register_mixer("mixit", short="mixit")
class MixiT(SequenceMixer):
    """SPEC §2 MixiT: no Q/K and no RoPE; each head mixes values with a fixed random,
    input-independent causal matrix (`mixit_matrices`), out = W_o(A v).

    The fixed draw (`mixit_draw`: u and the centred normals C) is a pair of persistent
    buffers (`sigma_u`, `noise`; saved in checkpoints, never trained or re-drawn). In a
    packed row, token t at document position p mixes the tokens of its own document with
    A[p, p'] = δ + σ_h(T_t)·C[p, p'], where T_t is what `sigma_length` says (the length of
    t's document by default), so each document gets exactly what it would alone."""

    Options = _MixiTOptions
    has_pattern = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        u, C = mixit_draw(H, opts.seq_len, mixit_seed(opts.seed, layer_idx))
        self.register_buffer("sigma_u", u.float())
        self.register_buffer("noise", C.float())
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

    def _sigma(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """σ_h of each token: lengths (its document's length) and positions (…) -> (H, …)."""
        mode = self.opts.sigma_length
        T = lengths if mode == "document" else positions + 1 if mode == "prefix" else self.opts.seq_len
        u = self.sigma_u.view(-1, *([1] * positions.dim()))
        return mixit_sigma(u, T, self.head_dim).expand(-1, *positions.shape)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        self._check_length(seq_len)  # a document may fill a row

    def _check_length(self, T: int) -> None:
        if T > self.noise.shape[-1]:
            raise ConfigError(f"mixit: documents of up to {T} tokens, but its fixed draw covers "
                              f"model.mixer_options.seq_len={self.noise.shape[-1]}")

    def sequence_weights(self, n: int) -> torch.Tensor:
        """The mixing weights of one document of `n` tokens, (H, n, n)."""
        self._check_length(n)
        pos = torch.arange(n, device=self.noise.device)
        sigma = self._sigma(torch.full_like(pos, n), pos)  # (H, n)
        A = torch.eye(n, dtype=self.noise.dtype, device=pos.device) + sigma[..., None] * self.noise[:, :n, :n]
        if self.opts.sink_head:
            A[0] = 0.5 * torch.eye(n, dtype=A.dtype, device=A.device)
            A[0, :, 0] += 0.5
        return A

    def weights(self, ctx: AttentionContext, T: int) -> torch.Tensor:
        """The mixing weights of this batch: (1 or B, H, T, T), zero across documents."""
        if ctx.single_document:
            return self.sequence_weights(T)[None]
        pos, seg = ctx.positions, ctx.segment_ids  # (B, T)
        same = seg[:, :, None] == seg[:, None, :]  # (B, T, T)
        self._check_length(int(pos.max()) + 1)
        lengths = same.sum(-1)  # (B, T): the length of each token's document (its segment in the row)
        sigma = self._sigma(lengths, pos)  # (H, B, T)
        eye = (pos[:, :, None] == pos[:, None, :]) & same  # (B, T, T)
        A = eye.to(self.noise.dtype) + sigma[..., None] * self.noise[:, pos[:, :, None], pos[:, None, :]]
        if self.opts.sink_head:
            A[0] = 0.5 * eye + 0.5 * (pos[:, None, :] == 0)
        return A.transpose(0, 1) * ctx.dense_mask  # (B, H, T, T)

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


# Mixers written in modules of their own register when their module is imported: imported
# here, so every name is in the registry wherever the registry is read.
import sanlab.model.sliding_window  # noqa: E402, F401
