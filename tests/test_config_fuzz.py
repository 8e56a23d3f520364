"""Property tests of the config layer: random `key=value` overrides and random TOML
snippets end in a valid config or a clean `ConfigError`, never in another exception,
and a config that validates holds no NaN or infinity anywhere."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sanlab.config import Config, apply_overrides, load_config
from sanlab.errors import ConfigError
from sanlab.study.spec import StudySpec

# Real keys (so many examples get past key resolution and exercise value parsing) plus noise.
KEYS = [
    "model.d_model", "model.n_layers", "model.rope_theta", "model.init_std", "model.norm_eps", "model.ffn",
    "model.residual", "model.d_ff", "data.dir", "data.seq_len", "optim.lr", "optim.adam_lr", "optim.beta1",
    "optim.beta2", "optim.eps", "optim.weight_decay", "optim.ns_coefficients", "optim.grad_clip",
    "optim.warmup_frac", "train.tokens", "train.steps", "train.milestones", "train.z_loss", "train.spike_factor",
    "train.batch_rows", "train.eval_every", "model", "optim", "nosuch.key", "model.d_model.deeper", "",
]
STUDY_KEYS = ["sweep.multipliers", "sweep.tokens", "sweep.base_lr.san_muon", "matching.tolerance",
              "matching.partner.init_std", "runner.tokens_per_s", "final.tokens", "seeds", "arms"]
NUMBERS = ["nan", "NaN", "inf", "-inf", "+inf", "Infinity", "-Infinity", "1e999", "-1e999", "0", "-0.0",
           "1e-400", "2M", "1.5B", "5Q", "9" * 400, "0x10", "1_000", "true", "null", "none", "[]", "{}"]

_atoms = st.one_of(
    st.sampled_from(NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(max_size=12),
)
_values = st.recursive(_atoms, lambda inner: st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
                       max_leaves=8)
_overrides = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS) | st.text(max_size=10), _values) | st.text(max_size=20)


def _assert_finite(value: Any, where: str = "") -> None:
    if isinstance(value, float):
        assert math.isfinite(value), f"{where} = {value} passed validation"
    elif isinstance(value, dict):
        for k, v in value.items():
            _assert_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _assert_finite(v, f"{where}[{i}]")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_overrides, min_size=1, max_size=4))
def test_random_overrides_validate_or_fail_cleanly(overrides: list[str]) -> None:
    try:
        cfg = apply_overrides(Config, {}, overrides)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)
        return
    _assert_finite(cfg.model_dump())


_SPEC_BASE = {"data": {"dir": "d", "seq_len": 32}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(STUDY_KEYS + KEYS), _values),
                min_size=1, max_size=3))
def test_random_study_overrides_validate_or_fail_cleanly(overrides: list[str]) -> None:
    try:
        spec = apply_overrides(StudySpec, _SPEC_BASE, overrides)
    except ConfigError:
        return
    _assert_finite(spec.model_dump())


_toml_keys = st.sampled_from(["d_model", "lr", "eps", "milestones", "rope_theta", "tokens", "x", "dir", "mix"])
_toml_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "+nan", "1e999", "0", "-1", "1.5", '"2M"', "true", "[1, nan]",
                     "[0.5, 1.0]", '{ math = nan }', '"text"', "[", "1979-05-27", "0x1F", "1__0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
_toml_lines = st.one_of(
    st.sampled_from(["[model]", "[optim]", "[train]", "[data]", "[nosuch]", "[model.x]", "[[arms]]", "[", ""]),
    st.builds(lambda k, v: f"{k} = {v}", _toml_keys, _toml_values),
    st.text(max_size=15),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_toml_lines, max_size=8))
def test_random_toml_validates_or_fails_cleanly(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cfg.toml"
        path.write_bytes("\n".join(lines).encode("utf-8", "replace"))
        try:
            cfg = load_config(path)
        except ConfigError as e:
            assert str(e) and "\n" not in str(e)
            return
    _assert_finite(cfg.model_dump())

