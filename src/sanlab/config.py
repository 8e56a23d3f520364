"""Typed, validated configuration.

A run is described by one `Config` with four sections: `model`, `data`, `optim`,
`train`. Configs load from TOML and accept command-line overrides of the form
`section.key=value`; every value is type-checked and an unknown key is an error
that names it (no `exec`, no globals).

The machinery every config is built from (`StrictModel`, `validate`, `load_toml`,
`apply_overrides`, token counts) lives in the leaf `sanlab.configbase` and is
re-exported here. Imports go one way: this module validates `model` against the mixer
registry (`sanlab.model.mixers`, whose torch-free specs declare each mixer's options on
the leaf), and the model code imports this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pydantic import Field, PrivateAttr, field_validator, model_validator

from sanlab.configbase import (
    M,
    StrictModel,
    Tokens,
    _in_range,
    apply_overrides,
    bare_words,
    ffn_contradiction,
    format_tokens,
    load_toml,
    parse_tokens,
    to_toml_dict,
    validate,
)
from sanlab.errors import ConfigError
from sanlab.fileio import parse_json
from sanlab.model.mixers import check_model

__all__ = ["LAYOUTS", "MAX_LAYERS", "MAX_SEQ_LEN", "STANDARD_MIXER", "Config", "DataConfig", "ModelConfig",
           "OptimConfig", "StrictModel", "Tokens", "TrainConfig", "apply_overrides", "bare_words",
           "ffn_contradiction", "format_tokens", "load_config", "load_toml", "parse_tokens", "standard_layers",
           "to_toml_dict", "validate"]

# --------------------------------------------------------------------------- sections


# Per-layer layouts (SPEC §3). A named layout places the *standard* (softmax) layers; the
# variant `model.mixer` fills the rest. Layer indices are 0-based.
LAYOUTS: tuple[str, ...] = (
    "uniform",  # the variant in every layer
    "hybrid",  # variant in odd layers (1, 3, …), softmax in even (0, 2, …): SPEC §3's hybrid
    "even", "odd",  # standard layers at even / odd indices
    "top", "middle", "bottom",  # standard layers in the top half / middle half / bottom half
    "every4",  # standard layers at 0, 4, 8, … (25%)
    "first", "last", "first_last",
)
STANDARD_MIXER = "softmax"
MAX_LAYERS = 100_000  # a bound on the per-layer lists a config builds (a typo of 10**30 layers is refused)
MAX_SEQ_LEN = 65_534  # the longest row `sanlab prepare` writes (segment ids are uint16)


def standard_layers(layout: str, n_layers: int) -> list[bool]:
    """For a named layout, which layers hold the standard (softmax) mixer."""
    L = n_layers
    rule = {
        "uniform": lambda i: False,
        "hybrid": lambda i: i % 2 == 0,
        "even": lambda i: i % 2 == 0,
        "odd": lambda i: i % 2 == 1,
        "top": lambda i: i >= L - L // 2,
        "bottom": lambda i: i < L // 2,
        "middle": lambda i: L // 4 <= i < L // 4 + L // 2 if L > 1 else True,
        "every4": lambda i: i % 4 == 0,
        "first": lambda i: i == 0,
        "last": lambda i: i == L - 1,
        "first_last": lambda i: i in (0, L - 1),
    }[layout]
    return [rule(i) for i in range(L)]


class ModelConfig(StrictModel):
    """Architecture (SPEC §1.1). The SAN is `state_mixer="none"` (`ffn=false`); the standard
    arm is `state_mixer="swiglu"` (`ffn=true`).

    The FFN of every block has one spelling, `state_mixer` (a registered state mixer, or
    none), and one alias, the `ffn` users know: on input `ffn=true/false` sets
    `state_mixer`, and `cfg.ffn` reads whether there is a state mixer. (config.json files
    written before `state_mixer` existed named the type `ffn_type` beside `ffn`; they keep
    loading.) The mixer names and options are checked against the registry's specs when
    the config validates (`sanlab.model.mixers.check_model`).
    """

    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of blocks."""
    n_heads: int = 4
    """Query heads; head_dim = d_model / n_heads (must be even for RoPE)."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide n_heads."""
    vocab_size: int = 2048
    """Embedding rows; must cover the prepared data's tokenizer (16384 at paper scale)."""
    state_mixer: str = "none"
    """The state mixer of every block: a registered FFN type (swiglu) or none (the SAN)."""
    ffn: bool | None = Field(default=None, exclude=True)
    """Input alias of state_mixer: true = swiglu (the standard arm), false = none (the SAN); reads back whether there is a state mixer."""
    d_ff: int | None = None  # None -> 4 * d_model
    residual: Literal["gated", "rezero", "standard", "none"] = "gated"
    """gated: x + σ(g)·f(x), g init 0; rezero: x + α·f(x), α init 0; standard: x + f(x); none: f(x)."""
    norm: Literal["zcrms", "rms"] = "zcrms"
    """zcrms: (1 + γ) ⊙ z / RMS(z) with γ init 0; rms: γ ⊙ z / RMS(z) with γ init 1."""
    qk_norm: bool = True
    """Per-head norm of q and k over head_dim, before RoPE (deep SANs diverge without it)."""
    sandwich_norm: bool = False
    """An extra norm on each sublayer's output, before its residual gate."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-6
    """Epsilon inside RMS(z)."""
    init_std: float = 0.02
    """Std of the normal init of embedding and input projections."""
    # W_o / W_down std = init_std / sqrt(2 * n_layers) (SPEC §1.1); false = unscaled (Theorem 1 contrast)
    scale_out_init: bool = True
    mixer: str = "softmax"
    """Registered sequence mixer: softmax attention or a variant (sanlab.model.mixers.MIXERS; docs/variants.md)."""
    mixer_options: dict[str, Any] = {}
    """The mixer's own options, validated by its `Options` model (an unknown key is an error)."""
    _options: StrictModel = PrivateAttr(default_factory=StrictModel)  # mixer_options typed: `options`
    layout: str | list[str] = "uniform"
    """Where the mixer goes: a named layout (uniform, hybrid, even, odd, top, middle, bottom, every4, first, last, first_last: the places of the softmax layers) or one mixer name per layer."""
    # Attention kernel. auto: FlexAttention on CUDA; on the CPU the fused compiled kernel
    # (sanlab.model.native: built with the system C compiler on first use), else the
    # block-causal explicit kernel while the probabilities it keeps fit
    # sanlab.model.attention.explicit.CPU_EXPLICIT_MAX_BYTES, SDPA with a dense mask beyond.
    attn_backend: Literal["auto", "fused", "explicit", "sdpa", "flex"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _ffn_alias(cls, data: Any) -> Any:
        """`ffn` is the input alias of `state_mixer`. When given, it decides whether there is a
        state mixer (so `{**cfg.model_dump(), "ffn": True}` and `model.ffn=false` on a file
        with `state_mixer = "swiglu"` do what they say); with `ffn=true` a named
        state_mixer picks its type. `ffn_type` is how config.json files from before
        `state_mixer` named that type."""
        if not isinstance(data, dict) or ("ffn" not in data and "ffn_type" not in data):
            return data
        data = dict(data)
        ffn, ffn_type = data.pop("ffn", None), data.pop("ffn_type", None)
        if ffn is not None and not isinstance(ffn, bool):
            raise ValueError(f"ffn: expected true or false, got {ffn!r}")
        given = data.get("state_mixer")
        if ffn is None:
            data.setdefault("state_mixer", ffn_type or "none")
        elif not ffn:
            data["state_mixer"] = "none"
        elif given in (None, "none"):
            data["state_mixer"] = ffn_type or "swiglu"
        data["ffn"] = None  # (the field's value is set from state_mixer after validation)
        return data

    @field_validator("layout", mode="before")
    @classmethod
    def _layout_list(cls, value: Any) -> Any:
        """A per-layer list may also be written `softmax,mlp,…` or as a JSON list string
        (what a command-line override gives)."""
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                return parse_json(value)
            except ValueError as e:  # malformed, or nested too deeply
                shown = value if len(value) <= 60 else value[:57] + "..."
                raise ValueError(f"layout: not a list of mixer names: {shown} ({e})") from None
        if isinstance(value, str) and "," in value:
            return [v.strip() for v in value.split(",")]
        return value

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_layers > MAX_LAYERS:  # the checks below walk the layers one by one
            raise ValueError(f"n_layers={self.n_layers} is more than {MAX_LAYERS:,} layers")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"head_dim={self.d_model // self.n_heads} is odd; RoPE needs an even head_dim"
            )
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")
        for key in ("rope_theta", "norm_eps", "init_std"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if isinstance(self.layout, str):
            if self.layout not in LAYOUTS:
                raise ValueError(f"layout: unknown layout {self.layout!r} (choose from {', '.join(LAYOUTS)}, "
                                 "or give one mixer name per layer)")
        elif len(self.layout) != self.n_layers:
            raise ValueError(f"layout: {len(self.layout)} mixers listed for n_layers={self.n_layers}")
        # `ffn` reads whether there is a state mixer (set directly: no re-validation loop)
        self.__dict__["ffn"] = self.state_mixer != "none"
        # the mixer names and options against the registry's specs (no torch); the options
        # typed by the mixer's spec, once
        try:
            self._options = check_model(self)
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("model.")) from None
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "ModelConfig":
        """A copy with `update` applied and validated (so `ffn` keeps working as an alias)."""
        if not update:
            return super().model_copy(deep=deep)
        data = self.model_dump()
        if ("ffn" in update or "ffn_type" in update) and "state_mixer" not in update:
            data.pop("state_mixer")
        return validate(type(self), {**data, **update}, source="model")

    @property
    def options(self) -> StrictModel:
        """`mixer_options` as the mixer's spec types them (its `Options` model, defaults filled
        in), validated once, when this config validated; `sanlab.model.mixers.mixer_options`
        gives any other mixer of the layout its defaults."""
        return self._options

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def layer_mixers(self) -> list[str]:
        """The sequence mixer of each layer, from `mixer` and `layout`."""
        if not isinstance(self.layout, str):
            return list(self.layout)
        return [STANDARD_MIXER if std else self.mixer for std in standard_layers(self.layout, self.n_layers)]

    @property
    def is_standard(self) -> bool:
        """Softmax attention in every layer (the SAN / standard arms of SPEC §1)."""
        return all(m == STANDARD_MIXER for m in self.layer_mixers)


class DataConfig(StrictModel):
    """Where the prepared (tokenized, packed) data lives and the row length."""

    dir: str | None = None  # a directory written by `sanlab prepare`
    seq_len: int = 256
    """Tokens per training row (T); must equal the prepared data's seq_len."""

    @field_validator("seq_len", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would read `true` as 1
            raise ValueError(f"seq_len must be an integer, got {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if not 0 < self.seq_len <= MAX_SEQ_LEN:
            raise ValueError(f"seq_len must lie in [1, {MAX_SEQ_LEN}], got {self.seq_len}")
        return self


class OptimConfig(StrictModel):
    """Optimizer and schedule (SPEC §1.3).

    `name=muon`: Muon at `lr` for every 2-D hidden matrix, AdamW at `adam_lr` (no decay)
    for embedding, norm gains and gates. `name=adamw`: AdamW at `lr` for everything,
    weight decay on matrices only.
    """

    name: Literal["muon", "adamw"] = "muon"
    """muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for everything."""
    lr: float = 0.02
    """Peak learning rate of the main group (Muon's matrices, or everything under adamw)."""
    adam_lr: float = 3e-4
    """Peak learning rate of the AdamW group in Muon runs (embedding, gains, gates)."""
    weight_decay: float = 0.01
    """Decoupled weight decay on matrices (Muon's, or AdamW's matrices under adamw)."""
    momentum: float = 0.95
    """Muon momentum."""
    nesterov: bool = True
    """Nesterov momentum in Muon."""
    ns_steps: int = 5
    """Newton–Schulz iterations that orthogonalise Muon's update."""
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    """Newton–Schulz polynomial coefficients (a, b, c)."""
    ns_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Precision of Muon's Newton–Schulz iterations. bf16 is torch.optim.Muon's; auto takes
    bf16 on a GPU or a CPU with bf16 dot-product instructions (AVX512-BF16, AMX) and fp32
    on other CPUs, where bf16 products are emulated and over 10x slower. Recorded resolved
    in config.json; runs written before this key ran bf16."""
    # torch.optim.Muon's adjust_lr_fn: "original" (max(1, rows/cols)^0.5) or "match_rms_adamw".
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    beta1: float = 0.9
    """AdamW β₁."""
    beta2: float = 0.95
    """AdamW β₂."""
    eps: float = 1e-8
    """AdamW ε."""
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    schedule: Literal["wsd", "cosine", "constant"] = "wsd"
    """wsd: warmup, constant, cosine decay at the end; cosine: warmup, then cosine; constant: warmup, then flat."""
    warmup_frac: float = 0.05
    """Share of the steps spent in linear warmup."""
    decay_frac: float = 0.15
    """Share of the steps in the final decay (wsd)."""
    final_lr_frac: float = 0.05
    """Learning rate at the last step, as a fraction of the peak."""

    @model_validator(mode="after")
    def _check(self) -> "OptimConfig":
        if self.lr <= 0 or self.adam_lr <= 0:
            raise ValueError("learning rates must be positive")
        _in_range(self, weight_decay=(0, None), momentum=(0, 1), beta1=(0, 1), beta2=(0, 1),
                  grad_clip=(0, None))
        if self.beta1 == 1 or self.beta2 == 1:
            raise ValueError("beta1 and beta2 must be below 1")
        if self.eps <= 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.ns_steps <= 0:
            raise ValueError(f"ns_steps must be positive, got {self.ns_steps}")
        if not (0 <= self.warmup_frac <= 1 and 0 <= self.decay_frac <= 1):
            raise ValueError("warmup_frac and decay_frac must lie in [0, 1]")
        if self.warmup_frac + self.decay_frac > 1:
            raise ValueError("warmup_frac + decay_frac must not exceed 1")
        if not (0 <= self.final_lr_frac <= 1):
            raise ValueError("final_lr_frac must lie in [0, 1]")
        return self


class TrainConfig(StrictModel):
    """Training length, batch, precision, evaluation and checkpointing."""

    tokens: Tokens | None = None  # training length in tokens, e.g. 2M (rounded up to whole steps) ...
    steps: int | None = None  # ... or in steps; exactly one of the two is needed to train
    batch_rows: int = 16  # global batch in rows of data.seq_len tokens
    micro_batch_rows: int | None = None  # per-rank micro-batch; None = whole per-rank batch
    seed: int = 0
    """Seed of the initialisation and of the data order."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else the CPU (recorded resolved in config.json)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast where the device has native bf16, else fp32 (recorded resolved)."""
    z_loss: float = 1e-4
    """Weight of the z-loss term z_loss · logsumexp(logits)²."""
    eval_every: int = 100  # steps; 0 = only at the end
    eval_rows: int = 64  # held-out rows per evaluation
    log_every: int = 10
    """Steps between console lines when there is no progress bar (metrics.jsonl gets every step)."""
    checkpoint_every: int = 0  # steps between rolling checkpoints; 0 = milestones only
    milestones: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0]
    """Fractions of training at which a milestone checkpoint is kept (the spectra analysis reads them)."""
    spike_factor: float | None = None  # loss > factor * running mean => diverged
    compile: bool | Literal["auto"] = "auto"
    """Train through torch.compile. auto: on CUDA, off on the CPU (recorded resolved in config.json); a compile that fails falls back to eager with a one-line warning (meta.json's device.compile says what ran)."""
    tensorboard: bool = False
    """Also log to TensorBoard in RUN_DIR (needs the log extra)."""
    wandb: bool = False
    """Also log to Weights & Biases, offline unless WANDB_MODE says otherwise (needs the log extra)."""
    threads: int | None = None  # torch intra-op threads on CPU; None = torch default
    freeze: list[Literal["qk", "qk_proj", "mlp"]] = []
    """Weights kept at their initialisation (SPEC §2): qk (Frozen-QK: W_q, W_k and the QK-norm gains, everything that shapes the scores from content), qk_proj (W_q, W_k only), mlp (the state mixer's weights: Frozen-MLP); frozen weights get no optimizer state."""

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.tokens is not None and self.steps is not None:
            raise ValueError("set train.tokens or train.steps, not both")
        for key in ("tokens", "steps", "micro_batch_rows", "threads"):
            v = getattr(self, key)
            if v is not None and v <= 0:
                raise ValueError(f"{key} must be positive, got {v}")
        if self.batch_rows <= 0:
            raise ValueError(f"batch_rows must be positive, got {self.batch_rows}")
        if any(not (0.0 <= m <= 1.0) for m in self.milestones):
            raise ValueError("milestones are fractions of training in [0, 1]")
        _in_range(self, z_loss=(0, None), eval_every=(0, None), eval_rows=(1, None), log_every=(1, None),
                  checkpoint_every=(0, None))
        if self.spike_factor is not None and self.spike_factor <= 0:
            raise ValueError(f"spike_factor must be positive, got {self.spike_factor}")
        return self


class Config(StrictModel):
    """A whole run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The architecture."""
    data: DataConfig = DataConfig()
    """The prepared data and the row length."""
    optim: OptimConfig = OptimConfig()
    """Optimizer and learning-rate schedule."""
    train: TrainConfig = TrainConfig()
    """Length, batch, precision, evaluation and checkpoints."""


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), cls: type[M] = Config  # type: ignore[assignment]
) -> M:
    """Load a config from an optional TOML file plus `section.key=value` overrides."""
    data = load_toml(path) if path is not None else {}
    return apply_overrides(cls, data, overrides, source=str(path) if path else "config")


