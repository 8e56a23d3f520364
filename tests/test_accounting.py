"""Parameter / FLOP accounting and the matching solver against the paper (SPEC §1.2) and the real model."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sanlab.accounting import (
    PRESET_SEQ_LEN,
    PRESETS,
    accounting_summary,
    count_flops,
    count_module_params,
    count_params,
    ladder_heads,
    measure_forward_flops,
    preset,
)
from sanlab.config import ModelConfig
from sanlab.errors import ConfigError, MatchingError
from sanlab.matching import Arm, match
from sanlab.model.lm import LM


def _m(n: int) -> float:
    """Millions, rounded as the paper prints them."""
    return round(n / 1e6, 2)


def _by_role(arms: list[Arm]) -> dict[str, Arm]:
    return {a.role: a for a in arms}


# --------------------------------------------------------------------------- Table 1


def test_table1_base_reproduced() -> None:
    arms = _by_role(match(preset("base"), PRESET_SEQ_LEN))
    san, iso_p, iso_f, iso_d = arms["reference"], arms["iso-param"], arms["iso-FLOP"], arms["iso-depth"]
    assert (san.config.n_layers, san.config.ffn) == (20, False)
    assert (_m(san.params.total), _m(san.params.non_embedding)) == (24.13, 15.74)
    assert (iso_p.config.n_layers, iso_p.config.ffn, iso_p.config.ffn_dim) == (4, True, 2048)
    assert (_m(iso_p.params.total), _m(iso_p.params.non_embedding)) == (24.12, 15.73)
    assert (_m(iso_d.params.total), _m(iso_d.params.non_embedding)) == (87.06, 78.67)
    assert iso_d.config.n_layers == 20
    # Full-square attention counting gives the paper's 0.40 and 0.20 exactly.
    assert round(san.flops.train / 1e9, 2) == 0.40
    assert round(iso_p.flops.train / 1e9, 2) == 0.20
    # "at most" picks 9 layers: 0.376 vs 0.396 GFLOPs/token (10 layers would be 0.412).
    assert iso_f.config.n_layers == 9
    assert (round(iso_f.flops.train / 1e9, 3), round(san.flops.train / 1e9, 3)) == (0.376, 0.396)
    assert iso_f.mismatch == pytest.approx(0.375914496 / 0.396361728 - 1)
    # The paper's "~43M / ~35M" for the iso-FLOP arm.
    assert (int(iso_f.params.total / 1e6), int(iso_f.params.non_embedding / 1e6)) == (43, 35)


def test_base_counts_exact_by_hand() -> None:
    """SPEC §1.2 convention written out: per layer 3d² + d + 2·dh + 1, SwiGLU 12d² + d + 1."""
    d, dh, V, L = 512, 64, 16384, 20
    san_layer = 3 * d * d + d + 2 * dh + 1
    assert count_params(preset("base")).non_embedding == L * san_layer + d
    assert count_params(preset("base")).embedding == V * d
    ffn_layer = san_layer + 12 * d * d + d + 1
    assert count_params(preset("base", ffn=True)).non_embedding == L * ffn_layer + d
    f = count_flops(preset("base"), 2048)
    assert f.forward == L * (2 * 3 * d * d + 4 * 2048 * d) + 2 * V * d
    assert f.train == 3 * f.forward == f.forward + f.backward


LADDER = {  # name -> (total, non-embedding) in millions (SPEC §1.2)
    "tiny": (6.16, 1.97),
    "small": (12.49, 6.20),
    "base": (24.13, 15.74),
    "large": (42.46, 31.97),
    "xl": (69.24, 56.65),
}


@pytest.mark.parametrize("name", list(LADDER))
def test_ladder_presets(name: str) -> None:
    cfg = preset(name)
    assert (cfg.n_layers, cfg.d_model) == PRESETS[name]
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.ffn) == (8, 4, 16384, False)
    p = count_params(cfg)
    assert (_m(p.total), _m(p.non_embedding)) == LADDER[name]
    # "the standard partner has the same d and L/5 layers": what iso-param matching gives.
    partner = _by_role(match(cfg, PRESET_SEQ_LEN, targets=["params"]))["iso-param"]
    assert (partner.config.n_layers, partner.config.d_model) == (cfg.n_layers // 5, cfg.d_model)


def test_presets_and_heads_reject_bad_input() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        preset("huge")
    assert ladder_heads(512) == (8, 4)
    assert ladder_heads(200) == (5, 5)  # 8, 7, 6 heads would give an odd or fractional head_dim
    ModelConfig(d_model=200, n_heads=5, n_kv_heads=5)  # the fallback is a valid model
    with pytest.raises(ConfigError, match="odd"):
        ladder_heads(201)


# --------------------------------------------------------------------------- FLOP terms


def test_flop_terms_and_causal_half() -> None:
    cfg = ModelConfig(d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=100, ffn=True, d_ff=96)
    T = 40
    full = count_flops(cfg, T)
    assert full.attn_proj == 3 * 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64)
    assert full.attn_scores == full.attn_mix == 3 * 2 * T * 64
    assert full.ffn == 3 * 2 * 3 * 64 * 96
    assert full.head == 2 * 100 * 64
    half = count_flops(cfg, T, causal_half=True)
    assert (half.attn_scores, half.attn_mix) == (full.attn_scores // 2, full.attn_mix // 2)
    assert (half.attn_proj, half.ffn, half.head) == (full.attn_proj, full.ffn, full.head)
    assert count_flops(cfg.model_copy(update={"ffn": False}), T).ffn == 0
    with pytest.raises(ConfigError, match="seq_len"):
        count_flops(cfg, 0)


# --------------------------------------------------------------------------- formula vs the real model

SWITCHES = list(itertools.product(
    (False, True),  # ffn
    ("gated", "rezero", "standard", "none"),  # residual
    ("zcrms", "rms"),  # norm
    (False, True),  # qk_norm
    (False, True),  # sandwich_norm
))


@pytest.mark.parametrize("ffn,residual,norm,qk_norm,sandwich", SWITCHES)
def test_formula_matches_module_params(ffn: bool, residual: str, norm: str, qk_norm: bool, sandwich: bool) -> None:
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn=ffn, d_ff=48,
                      residual=residual, norm=norm, qk_norm=qk_norm, sandwich_norm=sandwich)  # type: ignore[arg-type]
    formula, module = count_params(cfg), count_module_params(LM(cfg))
    # Compared name by name, so a disagreement names the component.
    assert formula.breakdown == module.breakdown
    assert (formula.total, formula.non_embedding, formula.embedding) == (
        module.total, module.non_embedding, module.embedding)


@pytest.mark.parametrize("ffn", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_forward_flops_match_flop_counter(ffn: bool, packed: bool) -> None:
    """Matrix products (projections, FFN, tied head) are compared term for term with the
    `aten.mm` count; the attention kernel, which FlopCounterMode counts as the full T×T
    square whatever the causal/document mask, with the formula's full-square attention
    terms. Elementwise ops (norms, RoPE, softmax, gates) are in neither count."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn=ffn, d_ff=48)
    B, T = 2, 16
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    segments = (torch.arange(T) >= T // 2).long().expand(B, T) if packed else None
    measured = measure_forward_flops(LM(cfg), tokens, segments)
    f = count_flops(cfg, T)
    matmuls = measured.by_op.pop("aten.mm")
    assert matmuls == B * T * (f.attn_proj + f.ffn + f.head)
    assert sum(measured.by_op.values()) == B * T * (f.attn_scores + f.attn_mix)
    assert measured.tokens == B * T and measured.per_token == f.forward


# --------------------------------------------------------------------------- matching


def test_policies_on_table1() -> None:
    base = preset("base")
    nearest = _by_role(match(base, PRESET_SEQ_LEN, policy="nearest"))
    assert (nearest["iso-param"].config.n_layers, nearest["iso-FLOP"].config.n_layers) == (4, 10)
    at_least = _by_role(match(base, PRESET_SEQ_LEN, policy="at_least"))
    assert (at_least["iso-param"].config.n_layers, at_least["iso-FLOP"].config.n_layers) == (5, 10)
    assert at_least["iso-param"].mismatch > 0 and at_least["iso-FLOP"].mismatch > 0


def test_ffn_reference_gets_san_partners() -> None:
    """The other way round: a 4-layer FFN model's iso-param SAN partner is 20 layers."""
    ref = preset("base", ffn=True).model_copy(update={"n_layers": 4})
    arms = _by_role(match(ref, PRESET_SEQ_LEN, policy="nearest"))
    assert arms["reference"].name == "FFN"
    assert arms["iso-param"].name == "SAN iso-param"
    assert (arms["iso-param"].config.ffn, arms["iso-param"].config.n_layers) == (False, 20)
    assert arms["iso-depth"].config.n_layers == 4


def _shape_neighbours(arm: Arm, vary: str) -> list[ModelConfig]:
    c = arm.config
    if vary == "depth":
        return [c.model_copy(update={"n_layers": n}) for n in (c.n_layers - 1, c.n_layers + 1) if n >= 1]
    step = 2 * c.n_heads
    return [c.model_copy(update={"d_model": w}) for w in (c.d_model - step, c.d_model + step) if w >= step]


@settings(max_examples=40, deadline=None)
@given(
    n_layers=st.integers(1, 24),
    width=st.integers(2, 40),
    ffn=st.booleans(),
    policy=st.sampled_from(["nearest", "at_most", "at_least"]),
    vary=st.sampled_from(["depth", "width"]),
    seq_len=st.sampled_from([64, 512, 2048]),
)
def test_solver_picks_the_best_partner_for_its_policy(
    n_layers: int, width: int, ffn: bool, policy: str, vary: str, seq_len: int
) -> None:
    """No neighbouring shape satisfies the policy better than the chosen one."""
    ref = ModelConfig(d_model=16 * width, n_layers=n_layers, n_heads=8, n_kv_heads=4, vocab_size=4096, ffn=ffn)
    try:
        arms = match(ref, seq_len, policy=policy, vary=vary, targets=["params", "flops"])  # type: ignore[arg-type]
    except MatchingError as e:
        # Only "at most" can be impossible: the smallest partner already exceeds the reference.
        assert policy == "at_most" and "the smallest" in str(e)
        return
    value = {"iso-param": lambda c: count_params(c).non_embedding,
             "iso-FLOP": lambda c: count_flops(c, seq_len).train}
    for arm in arms[1:]:
        f = value[arm.role]
        target, got = f(ref), f(arm.config)
        assert arm.mismatch == pytest.approx((got - target) / target)
        assert arm.config.ffn != ref.ffn
        if vary == "depth":
            assert arm.config.d_model == ref.d_model
        else:
            assert arm.config.n_layers == ref.n_layers and arm.config.d_model % 16 == 0
        if policy == "at_most":
            assert got <= target
        if policy == "at_least":
            assert got >= target
        for other in _shape_neighbours(arm, vary):
            v = f(other)
            if policy == "at_most":
                assert v > target or v < got
            elif policy == "at_least":
                assert v < target or v > got
            else:
                assert abs(v - target) >= abs(got - target)


def test_partner_switches_follow_reference_or_overrides() -> None:
    ref = preset("tiny").model_copy(update={"residual": "rezero", "sandwich_norm": True})
    arms = match(ref, PRESET_SEQ_LEN)
    for arm in arms[1:]:
        assert (arm.config.residual, arm.config.sandwich_norm) == ("rezero", True)
    arms = match(ref, PRESET_SEQ_LEN, partner={"residual": "standard", "d_ff": 512})
    for arm in arms[1:]:
        assert (arm.config.residual, arm.config.ffn_dim, arm.config.sandwich_norm) == ("standard", 512, True)
    # The partner's width may differ from the reference when depth is searched.
    narrow = _by_role(match(ref, PRESET_SEQ_LEN, partner={"d_model": 128}))
    assert narrow["iso-depth"].config.d_model == 128 and narrow["iso-depth"].config.n_layers == 10
    with pytest.raises(MatchingError, match="n_layers is what the solver chooses"):
        match(ref, PRESET_SEQ_LEN, partner={"n_layers": 3})
    with pytest.raises(ConfigError, match="partner"):
        match(ref, PRESET_SEQ_LEN, partner={"n_heads": 7})


def test_width_search_keeps_explicit_ffn_ratio() -> None:
    ref = preset("base").model_copy(update={"d_ff": 1024})  # a 2·d expansion for the partner
    iso_p = _by_role(match(ref, PRESET_SEQ_LEN, vary="width"))["iso-param"]
    assert iso_p.config.n_layers == 20
    assert iso_p.config.ffn_dim == 2 * iso_p.config.d_model


def test_matching_errors() -> None:
    tiny_san = preset("base").model_copy(update={"n_layers": 1})
    with pytest.raises(MatchingError, match="no FFN partner with at most"):
        match(tiny_san, PRESET_SEQ_LEN)
    with pytest.raises(MatchingError, match=r"FFN iso-FLOP: .* -5\.16% off .* tolerance of 1\.00%"):
        match(preset("base"), PRESET_SEQ_LEN, tolerance=0.01)
    assert len(match(preset("base"), PRESET_SEQ_LEN, tolerance=0.06)) == 4
    for kwargs in ({"policy": "closest"}, {"vary": "heads"}, {"targets": ["speed"]}, {"tolerance": -1.0}):
        with pytest.raises(MatchingError):
            match(preset("base"), PRESET_SEQ_LEN, **kwargs)  # type: ignore[arg-type]


def test_arm_dict_has_the_contract_fields() -> None:
    d = match(preset("base"), PRESET_SEQ_LEN)[2].to_dict()
    assert {k: d[k] for k in ("name", "n_layers", "d_model", "ffn", "d_ff")} == {
        "name": "FFN iso-FLOP", "n_layers": 9, "d_model": 512, "ffn": True, "d_ff": 2048}
    assert d["params_total"] == count_params(ModelConfig(**d["config"])).total
    assert d["train_flops_per_token"] == d["flops"]["train"] == 3 * d["forward_flops_per_token"]
    assert d["matched_on"] == "train_flops_per_token" and d["mismatch"] < 0
    # No targets: the reference alone, a one-call way to account for any model.
    (only,) = match(preset("tiny"), PRESET_SEQ_LEN, targets=())
    assert only.role == "reference" and only.params == count_params(preset("tiny"))


def test_accounting_summary_is_json_data() -> None:
    s = json.loads(json.dumps(accounting_summary(preset("base"), 2048, causal_half=True)))
    assert (s["params_total"], s["params_non_embedding"], s["params_embedding"]) == (24130580, 15741972, 8388608)
    assert s["params_breakdown"]["attn.wq.weight"] == 20 * 512 * 512
    assert s["flops"]["causal_half"] and s["train_flops_per_token"] == 3 * s["forward_flops_per_token"]
    assert s["flops"]["attn_scores"] == 20 * 2048 * 512
