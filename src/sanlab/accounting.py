"""Parameter and FLOP accounting, and the paper's size ladder (SPEC §1.2).

Removing the FFN changes parameters, FLOPs per token and depth at once, so every
comparison in a study rests on these numbers. They are computed two ways:

- from the formula (`count_params`, `count_flops`), which needs no model and is what
  the matching solver searches over; the counting convention is the paper's and
  reproduces its Table 1 exactly;
- from an instantiated module (`count_module_params`, `measure_forward_flops`), which
  the tests hold the formula against for every architecture switch.

Parameter breakdowns are keyed by parameter name with the `blocks.{i}.` prefix removed
(`attn.wq.weight`, `ffn_gate`, ...), so a formula breakdown and a module breakdown
can be compared key by key and a disagreement names the component.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError
from sanlab.model.mixers import NoOptions, mixer_options, mixer_spec, state_mixer_spec

if TYPE_CHECKING:
    import torch
    from torch import nn

EMBEDDING_PARAM = "embed.weight"
# Residual kinds that carry one learned scalar per sublayer (σ(g) for gated, α for rezero).
_SCALAR_RESIDUALS = ("gated", "rezero")
# Names of the sandwich norms: an extra norm on each sublayer's output before its gate.
ATTN_SANDWICH_PARAM = "attn_post_norm.weight"
FFN_SANDWICH_PARAM = "ffn_post_norm.weight"


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamCount:
    """Parameter totals and a breakdown by parameter name (layer prefix removed, summed over layers)."""

    total: int
    non_embedding: int
    embedding: int
    breakdown: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def layer_params(cfg: ModelConfig, layer: int) -> dict[str, int]:
    """Parameters of block `layer` by name (relative to the block): the norms and residual
    scalars of its sublayers, plus what its sequence mixer (`attn.…`) and state mixer
    (`ffn.…`) declare (their specs' `params`). Zero-sized components are left out."""
    d = cfg.d_model
    scalar = 1 if cfg.residual in _SCALAR_RESIDUALS else 0
    name = cfg.layer_mixers[layer]
    p: dict[str, int] = {"attn_norm.weight": d}
    p |= {f"attn.{k}": v for k, v in mixer_spec(name).param_terms(cfg, mixer_options(cfg, name)).items()}
    if cfg.sandwich_norm:
        p[ATTN_SANDWICH_PARAM] = d
    if scalar:
        p["attn_gate"] = scalar
    if cfg.ffn:
        p["ffn_norm.weight"] = d
        p |= {f"ffn.{k}": v for k, v in state_mixer_spec(cfg.state_mixer).param_terms(cfg, NoOptions()).items()}
        if cfg.sandwich_norm:
            p[FFN_SANDWICH_PARAM] = d
        if scalar:
            p["ffn_gate"] = scalar
    return p


def count_params(cfg: ModelConfig) -> ParamCount:
    """Parameters of `cfg` by the paper's convention: tied embedding V·d counted once;
    the per-layer terms summed over the layer layout."""
    breakdown: dict[str, int] = defaultdict(int)
    for layer in range(cfg.n_layers):
        for k, v in layer_params(cfg, layer).items():
            breakdown[k] += v
    breakdown["final_norm.weight"] = cfg.d_model
    embedding = cfg.vocab_size * cfg.d_model
    non_embedding = sum(breakdown.values())
    breakdown[EMBEDDING_PARAM] = embedding
    return ParamCount(non_embedding + embedding, non_embedding, embedding, dict(breakdown))


_LAYER_PREFIX = re.compile(r"^blocks\.\d+\.")


def count_module_params(model: nn.Module) -> ParamCount:
    """Parameters of an instantiated model; the embedding is `embed.weight`.

    `named_parameters` yields a tied weight once, so the tied head is not counted twice,
    exactly as in the formula.
    """
    breakdown: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        breakdown[_LAYER_PREFIX.sub("", name)] += p.numel()
    total = sum(breakdown.values())
    embedding = breakdown.get(EMBEDDING_PARAM, 0)
    return ParamCount(total, total - embedding, embedding, dict(breakdown))


# --------------------------------------------------------------------------- FLOPs


# The terms every FlopCount reports (zero when a model has none), in table order; a
# variant's own terms (e.g. `attn_state` of Taylor attention) follow them.
CORE_FLOP_TERMS = ("attn_proj", "attn_scores", "attn_mix", "ffn", "head")


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per token, every term visible (a multiply-add counts 2).

    `terms` maps each named term (as the mixers declare them, `sanlab.model.mixers`) to
    its FLOPs summed over all layers, plus the tied head. For softmax attention
    `attn_scores` (q·kᵀ) and `attn_mix` (A·v) are the full T×T square unless
    `causal_half`, which counts only the causal half. Training is 3× forward (the
    backward pass costs twice the forward).
    """

    seq_len: int
    causal_half: bool
    n_layers: int
    terms: dict[str, int]

    def term(self, name: str) -> int:
        return self.terms.get(name, 0)

    @property
    def attn_proj(self) -> int:  # 2·(Q, K, V, O weights) per layer
        return self.term("attn_proj")

    @property
    def attn_scores(self) -> int:  # 2·T·(H·dh) per layer (halved when causal_half)
        return self.term("attn_scores")

    @property
    def attn_mix(self) -> int:  # 2·T·(H·dh) per layer (halved when causal_half)
        return self.term("attn_mix")

    @property
    def ffn(self) -> int:  # 2·3·d·d_ff per layer
        return self.term("ffn")

    @property
    def head(self) -> int:  # 2·V·d
        return self.term("head")

    @property
    def forward(self) -> int:
        return sum(self.terms.values())

    @property
    def backward(self) -> int:
        return 2 * self.forward

    @property
    def train(self) -> int:
        return self.forward + self.backward

    def term_names(self) -> list[str]:
        return [*CORE_FLOP_TERMS, *(k for k in self.terms if k not in CORE_FLOP_TERMS)]

    def to_dict(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "causal_half": self.causal_half, "n_layers": self.n_layers,
                **{k: self.term(k) for k in self.term_names()},
                "forward": self.forward, "backward": self.backward, "train": self.train}


def layer_flops(cfg: ModelConfig, layer: int, seq_len: int, causal_half: bool = False) -> dict[str, int]:
    """Forward FLOPs per token of block `layer`: what its mixers' specs declare (`flops`)."""
    name = cfg.layer_mixers[layer]
    f = dict(mixer_spec(name).flops(cfg, mixer_options(cfg, name), seq_len, causal_half))
    if cfg.ffn:
        for k, v in state_mixer_spec(cfg.state_mixer).flops(cfg, NoOptions(), seq_len, causal_half).items():
            f[k] = f.get(k, 0) + v
    return f


def count_flops(cfg: ModelConfig, seq_len: int, *, causal_half: bool = False) -> FlopCount:
    """Training and forward FLOPs per token of `cfg` at row length `seq_len` (SPEC §1.2).

    Only matrix products are counted: norms, RoPE, softmax and gates are elementwise and
    negligible next to them, and the embedding lookup is a gather. Each query meets T
    keys (full square) or on average T/2 (causal half); the exact causal count would be
    (T+1)/2, the convention is the half.
    """
    if seq_len <= 0:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    terms: dict[str, int] = {}
    for layer in range(cfg.n_layers):
        for k, v in layer_flops(cfg, layer, seq_len, causal_half).items():
            terms[k] = terms.get(k, 0) + v
    terms["head"] = 2 * cfg.vocab_size * cfg.d_model
    return FlopCount(seq_len=seq_len, causal_half=causal_half, n_layers=cfg.n_layers, terms=terms)


def _sdpa_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                out_shape: Any = None, **kwargs: Any) -> int:
    """Full-square FLOPs of one SDPA call: q·kᵀ and A·v, each 2·B·H·Tq·Tk·d.

    torch's FlopCounterMode has formulas for the CUDA SDPA kernels but none for the CPU
    flash kernel, which it would count as zero; this one matches its CUDA convention.
    """
    b, h, tq, dq = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * tq * tk * dq + 2 * b * h * tq * tk * dv


def _qkv_attention_flops(qkv_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """`sanlab::qkv_attention` as SDPA on its q, k and v: (qkv, gq, gk, cos, sin, starts,
    eps, heads, kv_heads, mode) with qkv (B, T, (H + 2·Hkv)·D)."""
    heads, kv_heads = args[6], args[7]
    b, t, w = qkv_shape
    d = w // (heads + 2 * kv_heads)
    return _sdpa_flops((b, heads, t, d), (b, kv_heads, t, d), (b, kv_heads, t, d))


@dataclass(frozen=True)
class MeasuredFlops:
    """What FlopCounterMode saw in one forward pass."""

    total: int
    tokens: int
    by_op: dict[str, int]

    @property
    def per_token(self) -> float:
        return self.total / self.tokens


def measure_forward_flops(model: nn.Module, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> MeasuredFlops:
    """Count the FLOPs of `model(tokens, *args, **kwargs)` with FlopCounterMode.

    Matrix products (mm, bmm, addmm, …), SDPA kernels and sanlab's fused attention are
    counted, attention as the full square whatever its mask; elementwise ops are not. Runs under no_grad, so only the
    forward pass is seen.
    """
    # lazy: torch; the accounting above imports without it (the study's tables, the report)
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import sanlab.model.attention.fused  # noqa: F401 - registers sanlab::fused_attention

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
               torch.ops.sanlab.fused_attention: _sdpa_flops,
               torch.ops.sanlab.qkv_attention: _qkv_attention_flops}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as fc:
        model(tokens, *args, **kwargs)
    by_op = {str(op): int(n) for op, n in fc.get_flop_counts()["Global"].items()}
    return MeasuredFlops(int(fc.get_total_flops()), tokens.numel(), by_op)


def accounting_summary(cfg: ModelConfig, seq_len: int, *, causal_half: bool = False) -> dict[str, Any]:
    """Params and FLOPs per token as plain JSON data (a run's meta.json, a matched arm)."""
    p, f = count_params(cfg), count_flops(cfg, seq_len, causal_half=causal_half)
    return {
        "params_total": p.total,
        "params_non_embedding": p.non_embedding,
        "params_embedding": p.embedding,
        "train_flops_per_token": f.train,
        "forward_flops_per_token": f.forward,
        "params_breakdown": p.breakdown,
        "flops": f.to_dict(),
    }


# --------------------------------------------------------------------------- presets

PRESET_SEQ_LEN = 2048
PRESET_VOCAB = 16384
# The paper's ladder (SPEC §1.2): name -> (SAN layers, d_model). The standard partner
# has the same width and about a fifth of the layers (what iso-param matching gives).
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (10, 256),
    "small": (14, 384),
    "base": (20, 512),
    "large": (26, 640),
    "xl": (32, 768),
}


def ladder_heads(d_model: int) -> tuple[int, int]:
    """8 query / 4 KV heads, or the most query heads below 8 that give an even head_dim.

    With an odd head count the KV heads equal the query heads (no grouping).
    """
    for h in range(8, 0, -1):
        if d_model % (2 * h) == 0:
            return h, h // 2 if h % 2 == 0 else h
    raise ConfigError(f"d_model={d_model} is odd: no head count gives an even head_dim")


def preset(name: str, *, ffn: bool = False) -> ModelConfig:
    """The SAN (or, with `ffn`, the same-depth standard) model of a ladder rung."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    n_layers, d_model = PRESETS[name]
    n_heads, n_kv_heads = ladder_heads(d_model)
    return ModelConfig(
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
        vocab_size=PRESET_VOCAB, ffn=ffn,
    )
