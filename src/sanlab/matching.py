"""The matching solver: iso-param, iso-FLOP and iso-depth partners of a reference arm (SPEC §1.2).

Removing the FFN changes parameters, FLOPs per token and depth at once, so a SAN is
compared with three standard arms, each matched on one of them. Given a reference
model the solver builds the partner (by default the other kind: a SAN reference gets
FFN partners and an FFN reference gets SAN partners, every other switch copied from
the reference, any of them overridable) and searches one size axis:

- `vary="depth"`: the number of layers at the partner's width (the paper's way);
- `vary="width"`: d_model in multiples of 2·n_heads (so head_dim stays even) at the
  partner's depth, which gives partners matched on depth *and* params (or FLOPs).

Both quantities grow strictly along either axis, so the search walks up from the
smallest size until it passes the target. The policy picks among the candidates:
`at_most` the largest not above the reference (the paper's Table 1: its iso-FLOP
partner is 9 layers, 0.376 vs 0.396 GFLOPs/token), `at_least` the smallest not below,
`nearest` the closest. Iso-param matches non-embedding parameters, iso-FLOP training
FLOPs per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

from sanlab.accounting import FlopCount, ParamCount, accounting_summary, count_flops, count_params
from sanlab.config import ModelConfig, validate
from sanlab.errors import MatchingError
from sanlab.model.mixers import mixer_spec

Policy = Literal["nearest", "at_most", "at_least"]
Target = Literal["params", "flops", "depth"]
Vary = Literal["depth", "width"]
POLICIES: tuple[Policy, ...] = ("at_most", "nearest", "at_least")
TARGETS: tuple[Target, ...] = ("params", "flops", "depth")
ROLES: dict[Target, str] = {"params": "iso-param", "flops": "iso-FLOP", "depth": "iso-depth"}
# A search that has not passed its target after this many steps is a nonsensical request.
_MAX_STEPS = 100_000


def layout_prefix(c: ModelConfig) -> str:
    """How the layers differ from softmax attention everywhere, for labels and run ids:
    '' (softmax in every layer), `nonapprox` (uniform), `hyb-nonapprox` (hybrid),
    `top-mlp` (a placement of the standard layers), `mixed-…` (an explicit list)."""
    if c.is_standard:
        return ""
    if not isinstance(c.layout, str):
        shorts = [mixer_spec(m).short for m in dict.fromkeys(c.layout) if m != "softmax"]
        return "mixed-" + "+".join(shorts)
    short = mixer_spec(c.mixer).short
    return {"uniform": short, "hybrid": f"hyb-{short}"}.get(c.layout, f"{c.layout}-{short}")


def layer_map(c: ModelConfig) -> str | None:
    """Which layers hold which mixer, for a model whose layers differ ("layers 0, 2: softmax;
    1, 3: nonapprox"); None when every layer holds the same one."""
    mixers = c.layer_mixers
    if len(set(mixers)) < 2:
        return None
    at: dict[str, list[int]] = {}
    for i, m in enumerate(mixers):
        at.setdefault(m, []).append(i)
    return "; ".join(f"layer{'s' if len(ix) > 1 else ''} {', '.join(map(str, ix))}: "
                     f"{m if m == 'softmax' else mixer_spec(m).short}" for m, ix in at.items())


def model_label(c: ModelConfig) -> str:
    """A short shape description: `20L d512, no FFN` or `4L d512, d_ff 2048`; a variant or
    layout comes first (`hyb-nonapprox-8L d128, no FFN`), a non-default norm is named
    (`…, rms norm`)."""
    label = f"{c.n_layers}L d{c.d_model}, " + (f"d_ff {c.ffn_dim}" if c.ffn else "no FFN")
    if c.ffn and c.state_mixer != "swiglu":
        label += f" {c.state_mixer}"
    prefix = layout_prefix(c)
    label = f"{prefix}-{label}" if prefix else label
    return label if c.norm == "zcrms" else f"{label}, {c.norm} norm"


@dataclass(frozen=True)
class Arm:
    """One model of a matched set, with its accounting and how far it is from the reference."""

    name: str  # "SAN", "FFN iso-param", ...
    role: str  # "reference" or the ROLES value it was matched for
    config: ModelConfig
    params: ParamCount
    flops: FlopCount
    mismatch: float  # signed (partner − reference) / reference in the matched quantity
    matched_on: str | None  # "params_non_embedding" | "train_flops_per_token" | "n_layers"

    @property
    def label(self) -> str:
        return model_label(self.config)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "role": self.role,
            "n_layers": c.n_layers,
            "d_model": c.d_model,
            "ffn": c.ffn,
            "state_mixer": c.state_mixer,
            "layer_mixers": c.layer_mixers,
            "d_ff": c.ffn_dim if c.ffn else None,
            "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads,
            **accounting_summary(c, self.flops.seq_len, causal_half=self.flops.causal_half),
            "mismatch": self.mismatch,
            "matched_on": self.matched_on,
            "config": c.model_dump(),
        }


def kind(cfg: ModelConfig) -> str:
    return "FFN" if cfg.ffn else "SAN"


def _arm(name: str, role: str, cfg: ModelConfig, seq_len: int, causal_half: bool,
         mismatch: float = 0.0, matched_on: str | None = None) -> Arm:
    return Arm(name, role, cfg, count_params(cfg), count_flops(cfg, seq_len, causal_half=causal_half),
               mismatch, matched_on)


def _resized(base: ModelConfig, vary: Vary, step: int) -> ModelConfig:
    """`base` at size `step` (1, 2, …) along the searched axis."""
    if vary == "depth":
        if not isinstance(base.layout, str):
            raise MatchingError("an explicit per-layer layout fixes the depth: match over width "
                                "(--width) or use a named layout")
        return base.model_copy(update={"n_layers": step})
    d_model = 2 * base.n_heads * step
    # An explicit d_ff keeps its ratio to d_model; None already means 4·d_model.
    d_ff = None if base.d_ff is None else max(1, round(base.d_ff * d_model / base.d_model))
    return base.model_copy(update={"d_model": d_model, "d_ff": d_ff})


def _select(candidates: list[tuple[ModelConfig, int]], target: int, policy: Policy,
            what: str, partner: str) -> tuple[ModelConfig, int]:
    """Pick from candidates sorted by strictly increasing value."""
    if policy == "at_most":
        below = [c for c in candidates if c[1] <= target]
        if not below:
            cfg, value = candidates[0]
            raise MatchingError(
                f"no {partner} partner with at most the reference's {what} ({target:,}): "
                f"the smallest, {_shape(cfg)}, has {value:,}"
            )
        return below[-1]
    if policy == "at_least":
        return next(c for c in candidates if c[1] >= target)
    return min(candidates, key=lambda c: (abs(c[1] - target), c[1]))


def _shape(cfg: ModelConfig) -> str:
    return f"{cfg.n_layers}L d{cfg.d_model}"


def _search(base: ModelConfig, vary: Vary, value: Callable[[ModelConfig], int], target: int,
            policy: Policy, what: str) -> tuple[ModelConfig, int]:
    candidates: list[tuple[ModelConfig, int]] = []
    for step in range(1, _MAX_STEPS + 1):
        cfg = _resized(base, vary, step)
        candidates.append((cfg, value(cfg)))
        if candidates[-1][1] > target:
            return _select(candidates, target, policy, what, kind(base))
    raise MatchingError(f"no {kind(base)} partner reaches the reference's {what} ({target:,})")


def match(
    reference: ModelConfig,
    seq_len: int,
    *,
    targets: Sequence[Target] = TARGETS,
    policy: Policy = "at_most",
    tolerance: float | None = None,
    causal_half: bool = False,
    vary: Vary = "depth",
    partner: Mapping[str, Any] | None = None,
) -> list[Arm]:
    """The reference arm followed by one partner per target, in the order of `targets`.

    `partner` holds ModelConfig fields that differ from the reference (default: only
    `ffn` flipped); the searched field (`n_layers` for depth, `d_model` for width) is
    chosen by the solver, so setting it there is an error. `tolerance` is the largest
    |relative mismatch| accepted; beyond it, or where the policy admits no partner,
    `MatchingError` says which arm and by how much.
    """
    if policy not in POLICIES:
        raise MatchingError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    if vary not in ("depth", "width"):
        raise MatchingError(f"unknown search axis {vary!r} (choose from depth, width)")
    for t in targets:
        if t not in TARGETS:
            raise MatchingError(f"unknown target {t!r} (choose from {', '.join(TARGETS)})")
    if tolerance is not None and tolerance < 0:
        raise MatchingError(f"tolerance must be non-negative, got {tolerance}")
    updates = dict(partner or {})
    searched = "n_layers" if vary == "depth" else "d_model"
    if searched in updates:
        raise MatchingError(f"partner {searched} is what the solver chooses (vary={vary}); do not set it")
    # the other kind (ffn flipped), unless the partner names its own state mixer
    flip = {} if {"ffn", "state_mixer"} & set(updates) else {"ffn": not reference.ffn}
    base = validate(ModelConfig, {**reference.model_dump(), **flip, **updates}, source="partner")

    ref = _arm(kind(reference), "reference", reference, seq_len, causal_half)
    arms = [ref]
    for t in targets:
        role = ROLES[t]
        name = f"{kind(base)} {role}"
        if t == "depth":
            cfg = validate(ModelConfig, {**base.model_dump(), "n_layers": reference.n_layers}, source="partner")
            arms.append(_arm(name, role, cfg, seq_len, causal_half, 0.0, "n_layers"))
            continue
        if t == "params":
            what, matched_on = "non-embedding parameters", "params_non_embedding"
            target = ref.params.non_embedding

            def value(c: ModelConfig) -> int:
                return count_params(c).non_embedding
        else:
            what, matched_on = "training FLOPs per token", "train_flops_per_token"
            target = ref.flops.train

            def value(c: ModelConfig) -> int:
                return count_flops(c, seq_len, causal_half=causal_half).train
        cfg, got = _search(base, vary, value, target, policy, what)
        mismatch = (got - target) / target
        if tolerance is not None and abs(mismatch) > tolerance:
            raise MatchingError(
                f"{name}: the best partner under policy {policy}, {_shape(cfg)}, is {mismatch:+.2%} "
                f"off the reference's {what}, beyond the tolerance of {tolerance:.2%}"
            )
        arms.append(_arm(name, role, cfg, seq_len, causal_half, mismatch, matched_on))
    return arms
