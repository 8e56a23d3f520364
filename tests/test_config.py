"""Typed config: TOML, `section.key=value` overrides, and one-line errors that name the key."""

from __future__ import annotations

import pytest

from sanlab.config import Config, ModelConfig, load_config, to_toml_dict
from sanlab.errors import ConfigError


def test_defaults_validate():
    cfg = Config()
    assert cfg.model.ffn is False and cfg.model.ffn_dim == 4 * cfg.model.d_model
    assert cfg.model.head_dim == cfg.model.d_model // cfg.model.n_heads


def test_toml_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nd_model = 64\nn_heads = 4\nffn = true\n[optim]\nname = "adamw"\n')
    cfg = load_config(
        path,
        ["model.n_layers=6", "optim.lr=2.4e-3", "train.milestones=[0, 0.5, 1]", "data.dir=/x/y", "model.d_ff=none"],
    )
    assert cfg.model.d_model == 64 and cfg.model.ffn is True and cfg.model.n_layers == 6
    assert cfg.optim.name == "adamw" and cfg.optim.lr == pytest.approx(2.4e-3)
    assert cfg.train.milestones == [0.0, 0.5, 1.0]
    assert cfg.data.dir == "/x/y" and cfg.model.d_ff is None
    # Booleans and tuples parse from the command line too.
    cfg = load_config(None, ["model.qk_norm=false", "optim.ns_coefficients=[1, 2, 3]"])
    assert cfg.model.qk_norm is False and cfg.optim.ns_coefficients == (1.0, 2.0, 3.0)


@pytest.mark.parametrize("raw,tokens", [("2M", 2_000_000), ("500k", 500_000), ("1.5B", 1_500_000_000),
                                        ("1e6", 1_000_000), ("2_000_000", 2_000_000), ("12345", 12_345)])
def test_token_counts_read_like_the_paper(raw, tokens, tmp_path):
    """train.tokens (and every other token budget) takes 2M / 500k / 1.5B / 1e6 on the command
    line and in TOML, as the README's commands use it."""
    assert load_config(None, [f"train.tokens={raw}"]).train.tokens == tokens
    path = tmp_path / "run.toml"
    path.write_text(f'[train]\ntokens = "{raw}"\n')
    assert load_config(path, []).train.tokens == tokens


def test_round_trip_through_dict():
    cfg = load_config(None, ["model.ffn=true", "train.steps=5"])
    assert Config.model_validate(to_toml_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.d_modl=3"], "unknown key model.d_modl"),
        (["modle.d_model=3"], "unknown key modle"),
        (["model.d_model=abc"], "model.d_model=abc"),
        (["model.residual=weird"], "model.residual=weird"),
        (["model.n_heads=3"], "n_heads=3 does not divide d_model=128"),
        (["model.n_kv_heads=3"], "n_kv_heads=3 does not divide n_heads=4"),
        (["model.d_model=24", "model.n_heads=8"], "head_dim=3 is odd"),
        (["train.tokens=10", "train.steps=10"], "not both"),
        (["optim.warmup_frac=0.9", "optim.decay_frac=0.5"], "must not exceed 1"),
        (["model.d_model"], "expected section.key=value"),
        (["model.d_model.x=1"], "has no sub-keys"),
        (["train.tokens=2Q"], "not a token count: '2Q'"),
        (["train.tokens=lots"], "not a token count"),
    ],
)
def test_bad_overrides_name_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nd_model = 1")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[model]\nwidth = 3\n")
    with pytest.raises(ConfigError, match="model.width: unknown key"):
        load_config(unknown)


def test_assignment_is_validated():
    cfg = ModelConfig()
    with pytest.raises(ValueError):
        cfg.residual = "bogus"  # type: ignore[assignment]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["match", "model.n_heads=3"], "does not divide d_model"),
        (["match", "model.n_kv_heads=3"], "does not divide n_heads"),
        (["match", "model.d_model=24", "model.n_heads=8"], "odd"),
        (["match", "model.bogus=1"], "unknown key"),
        (["nonexistent-command"], "unknown command"),
    ],
)
def test_cli_bad_model_input_exits_2_with_one_line(argv, message, capsys):
    from sanlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sanlab: error:") and message in err and "\n" not in err


def test_override_into_dict_field_keeps_siblings():
    from sanlab.config import StrictModel, apply_overrides

    class Inner(StrictModel):
        mix: dict[str, float] = {"a": 1.0, "b": 2.0}
        size: int = 3

    class Outer(StrictModel):
        inner: Inner = Inner()

    cfg = apply_overrides(Outer, {}, ["inner.mix.b=0.5", "inner.mix.c=4"])
    assert cfg.inner.mix == {"a": 1.0, "b": 0.5, "c": 4.0} and cfg.inner.size == 3
    cfg = apply_overrides(Outer, {"inner": {"mix": {"a": 9.0}}}, ["inner.mix.b=1"])
    assert cfg.inner.mix == {"a": 9.0, "b": 1.0}
    with pytest.raises(ConfigError, match="inner.mix.b=x"):
        apply_overrides(Outer, {}, ["inner.mix.b=x"])
    with pytest.raises(ConfigError, match="has no sub-keys"):
        apply_overrides(Outer, {}, ["inner.size.x=1"])


def test_override_of_synth_mix_weight():
    from sanlab.data.prepare import PrepareConfig

    cfg = load_config(None, ["synth.mix.math=5", "synth.people=50"], cls=PrepareConfig)
    assert cfg.synth.mix["math"] == 5.0 and cfg.synth.people == 50
    assert set(cfg.synth.mix) == set(PrepareConfig().synth.mix)  # the other weights stay


def test_token_counts_print_in_the_largest_unit_they_reach():
    """Run ids and tables write 10^6 as 1M (not 1000K), 10^9 as 1B, to 4 significant digits."""
    from sanlab.config import format_tokens

    assert [format_tokens(n) for n in (999, 1000, 2_500_000, 10**6, 10**9, 5 * 10**9, 105 * 10**9, 10**12)] == \
        ["999", "1K", "2.5M", "1M", "1B", "5B", "105B", "1T"]


def test_a_list_of_bare_words_is_a_list_of_strings():
    """`train.freeze=[qk]` is what a shell leaves of `train.freeze=["qk"]` inside a quoted
    `--arm '…'`; it means the same. Numbers stay numbers, and a word where a number goes is
    still refused."""
    from sanlab.config import apply_overrides

    assert apply_overrides(Config, {}, ["train.freeze=[qk]"]).train.freeze == ["qk"]
    assert apply_overrides(Config, {}, ["train.freeze=[qk, mlp]"]).train.freeze == ["qk", "mlp"]
    assert apply_overrides(Config, {}, ['train.freeze=["qk"]']).train.freeze == ["qk"]
    assert apply_overrides(Config, {}, ["train.freeze=[]"]).train.freeze == []
    with pytest.raises(ConfigError, match="optim.lr=\\[a\\]"):
        apply_overrides(Config, {}, ["optim.lr=[a]"])


def test_an_absurd_layer_count_is_refused_before_any_per_layer_list_is_built():
    """`model.n_layers=10**30` once built a per-layer list during validation (24 GB, then
    the OOM killer); it is a one-line error now, at once."""
    from sanlab.config import MAX_LAYERS, apply_overrides

    with pytest.raises(ConfigError, match="is more than 100,000 layers"):  # cheap to check without the bound too
        apply_overrides(Config, {}, [f"model.n_layers={MAX_LAYERS + 1}"])
    with pytest.raises(ConfigError, match=r"n_layers=1000000000000000000000000000000 is more than 100,000 layers"):
        apply_overrides(Config, {}, ["model.n_layers=1000000000000000000000000000000"])
    assert MAX_LAYERS == 100_000
    assert apply_overrides(Config, {}, [f"model.n_layers={MAX_LAYERS}"]).model.n_layers == MAX_LAYERS


def test_mixer_options_are_typed_by_the_mixer_s_spec_once_when_the_config_validates(monkeypatch):
    """`model.mixer_options` is read typed (`cfg.options`, the spec's `Options` with its
    defaults filled in) and validated once: building the accounting does not validate it again,
    and the layout's other mixers (softmax in a hybrid) get their own defaults."""
    from sanlab import accounting
    from sanlab.model.mixers import mixer_options, mixer_spec
    from sanlab.model.mixers.spec import MixerSpec

    cfg = ModelConfig(mixer="mlp", layout="hybrid", n_layers=4, mixer_options={"d_hidden": 24})
    assert type(cfg.options) is mixer_spec("mlp").Options and cfg.options.d_hidden == 24
    assert mixer_options(cfg, "mlp") is cfg.options
    assert type(mixer_options(cfg, "softmax")) is mixer_spec("softmax").Options
    assert cfg.model_dump()["mixer_options"] == {"d_hidden": 24}  # config.json keeps what was written
    assert ModelConfig(mixer="mlp").options.d_hidden is None
    assert cfg.model_copy(update={"mixer_options": {"d_hidden": 8}}).options.d_hidden == 8
    calls = []
    real = MixerSpec.validate_options.__func__
    monkeypatch.setattr(MixerSpec, "validate_options",
                        classmethod(lambda cls, raw, source: calls.append(cls.name) or real(cls, raw, source)))
    with_opts = accounting.count_params(cfg)
    assert "mlp" not in calls
    # the option is the one the accounting used: w_gate, w_up, w_down are d × 24 each, in 2 of the 4 layers
    wider = accounting.count_params(cfg.model_copy(update={"mixer_options": {"d_hidden": 25}}))
    assert wider.non_embedding - with_opts.non_embedding == 2 * 3 * cfg.d_model
    with pytest.raises(ConfigError, match=r"model: mixer_options \(mixer mlp\): d_hidden"):
        load_config(None, ["model.mixer=mlp", "model.mixer_options.d_hidden=0"])


def test_assigning_a_model_field_validates_and_a_refused_value_leaves_the_config_as_it_was() -> None:
    """`cfg.d_model = 32` works (it raised AttributeError 'ffn': the alias validator dropped
    the field on assignment); `cfg.ffn = True` sets the state mixer as on input; a refused
    assignment raises and keeps every field as it was (pydantic had already stored it)."""
    import pydantic

    m = ModelConfig(d_model=64, n_heads=4)
    m.d_model = 32
    assert m.d_model == 32 and m.head_dim == 8 and m.ffn is False and m.state_mixer == "none"
    m.ffn = True
    assert m.ffn is True and m.state_mixer == "swiglu" and "ffn" not in m.model_dump()
    m.state_mixer = "none"
    assert m.ffn is False
    with pytest.raises(pydantic.ValidationError, match="does not divide d_model=33"):
        m.d_model = 33
    assert m.d_model == 32 and m.model_dump() == ModelConfig(d_model=32, n_heads=4).model_dump()
    cfg = Config()
    with pytest.raises(pydantic.ValidationError):
        cfg.train.batch_rows = -1
    assert cfg.train.batch_rows == Config().train.batch_rows
