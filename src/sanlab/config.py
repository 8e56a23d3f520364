"""Typed, validated configuration.

A run is described by one `Config` with four sections: `model`, `data`, `optim`,
`train`. Configs load from TOML and accept command-line overrides of the form
`section.key=value`; every value is type-checked and an unknown key is an error
that names it (no `exec`, no globals).

Other tools reuse the same machinery for their own configs (`StrictModel`,
`apply_overrides`, `load_toml`).
"""

from __future__ import annotations

import collections.abc
import json
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from sanlab.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_TOKENS_RE = re.compile(r"^\s*([0-9][0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)


def parse_tokens(value: Any) -> Any:
    """Token counts as integers or as strings that read like the paper: '5B', '2.5M',
    '500k', '1e6', '2_000_000'. Anything else is left for the int validator to reject."""
    if isinstance(value, str):
        m = _TOKENS_RE.match(value)
        if not m:
            raise ValueError(f"not a token count: {value!r} (use an integer or e.g. '5B', '2M', '500k')")
        return int(round(float(m.group(1).replace("_", "")) * _SUFFIX.get(m.group(2).upper(), 1)))
    return value


Tokens = Annotated[int, BeforeValidator(parse_tokens)]


def format_tokens(n: int) -> str:
    """Short form used in run ids and tables: 5000000000 -> '5B', 2500000 -> '2.5M'."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return str(n)


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


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

    `ffn` is kept as the spelling users know: on input `ffn=true/false` sets `state_mixer`
    (true: `swiglu`, or the legacy `ffn_type`), and `cfg.ffn` reads whether there is a
    state mixer. Old configs with `ffn` / `ffn_type` keep loading.
    """

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 2048
    # The state mixer of every block (a registered FFN type) or "none" (the SAN).
    state_mixer: str = "none"
    # Input alias of state_mixer (see the class doc); after validation it reads
    # `state_mixer != "none"`. Not written into dumps: state_mixer is the one field.
    ffn: bool | None = Field(default=None, exclude=True)
    d_ff: int | None = None  # None -> 4 * d_model
    residual: Literal["gated", "rezero", "standard", "none"] = "gated"
    norm: Literal["zcrms", "rms"] = "zcrms"
    qk_norm: bool = True
    sandwich_norm: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    # W_o / W_down std = init_std / sqrt(2 * n_layers) (SPEC §1.1); false = unscaled (Theorem 1 contrast)
    scale_out_init: bool = True
    # Registered sequence mixer: softmax attention or a variant (sanlab.model.mixers.MIXERS) ...
    mixer: str = "softmax"
    # ... its own options, validated by the mixer's `Options` model (unknown key: an error) ...
    mixer_options: dict[str, Any] = {}
    # ... and where it goes: a named layout (LAYOUTS) or one registered mixer name per layer.
    layout: str | list[str] = "uniform"
    # Attention kernel. auto: FlexAttention on CUDA; on the CPU the block-causal explicit
    # kernel (faster than SDPA from T = 64 to 1024, measured) while the probabilities it
    # keeps fit sanlab.model.kernels.CPU_EXPLICIT_MAX_SCORES, SDPA with a dense mask beyond.
    attn_backend: Literal["auto", "explicit", "sdpa", "flex"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _ffn_alias(cls, data: Any) -> Any:
        """`ffn` (and the legacy `ffn_type`) are input spellings of `state_mixer`. When given,
        `ffn` decides whether there is a state mixer (so `{**cfg.model_dump(), "ffn": True}`
        and `model.ffn=false` on a file with `state_mixer = "swiglu"` do what they say);
        with `ffn=true` a named state_mixer (or the legacy ffn_type) picks its type."""
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
        return data

    @field_validator("layout", mode="before")
    @classmethod
    def _layout_list(cls, value: Any) -> Any:
        """A per-layer list may also be written `softmax,mlp,…` or as a JSON list string
        (what a command-line override gives)."""
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"layout: not a list of mixer names: {value}") from None
        if isinstance(value, str) and "," in value:
            return [v.strip() for v in value.split(",")]
        return value

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
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
        if isinstance(self.layout, str):
            if self.layout not in LAYOUTS:
                raise ValueError(f"layout: unknown layout {self.layout!r} (choose from {', '.join(LAYOUTS)}, "
                                 "or give one mixer name per layer)")
        elif len(self.layout) != self.n_layers:
            raise ValueError(f"layout: {len(self.layout)} mixers listed for n_layers={self.n_layers}")
        # `ffn` reads whether there is a state mixer (set directly: no re-validation loop)
        self.__dict__["ffn"] = self.state_mixer != "none"
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

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {self.seq_len}")
        return self


class OptimConfig(StrictModel):
    """Optimizer and schedule (SPEC §1.3).

    `name=muon`: Muon at `lr` for every 2-D hidden matrix, AdamW at `adam_lr` (no decay)
    for embedding, norm gains and gates. `name=adamw`: AdamW at `lr` for everything,
    weight decay on matrices only.
    """

    name: Literal["muon", "adamw"] = "muon"
    lr: float = 0.02
    adam_lr: float = 3e-4
    weight_decay: float = 0.01
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    # torch.optim.Muon's adjust_lr_fn: "original" (max(1, rows/cols)^0.5) or "match_rms_adamw".
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    schedule: Literal["wsd", "cosine", "constant"] = "wsd"
    warmup_frac: float = 0.05
    decay_frac: float = 0.15
    final_lr_frac: float = 0.05

    @model_validator(mode="after")
    def _check(self) -> "OptimConfig":
        if self.lr <= 0 or self.adam_lr <= 0:
            raise ValueError("learning rates must be positive")
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
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    z_loss: float = 1e-4
    eval_every: int = 100  # steps; 0 = only at the end
    eval_rows: int = 64  # held-out rows per evaluation
    log_every: int = 10
    checkpoint_every: int = 0  # steps between rolling checkpoints; 0 = milestones only
    milestones: list[float] = [0.0, 0.25, 0.5, 0.75, 1.0]
    spike_factor: float | None = None  # loss > factor * running mean => diverged
    compile: bool = False
    tensorboard: bool = False
    wandb: bool = False
    threads: int | None = None  # torch intra-op threads on CPU; None = torch default
    # Weights kept at their initialisation (SPEC §2): "qk" (W_q, W_k: Frozen-QK), "mlp" (the
    # state mixer's weights: Frozen-MLP). Frozen weights get no optimizer state.
    freeze: list[Literal["qk", "mlp"]] = []

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
        return self


class Config(StrictModel):
    """A whole run."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()


# --------------------------------------------------------------------------- loading


def _format_validation_error(err: ValidationError, prefix: str = "") -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if p != "__root__")
    if prefix:
        loc = f"{prefix}.{loc}" if loc else prefix
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{loc}: {msg}" if loc else msg


def validate(cls: type[M], data: Mapping[str, Any], *, source: str = "config") -> M:
    """Validate a mapping into `cls`, turning pydantic's report into one clear line."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {_format_validation_error(e)}") from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, with a one-line error for a missing or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: malformed TOML: {e}") from None


def _dict_value_type(annotation: Any) -> Any | None:
    """The value type of a `dict[str, V]` annotation (also inside `Optional`), else None."""
    if typing.get_origin(annotation) in (dict, Mapping, collections.abc.Mapping):
        return typing.get_args(annotation)[1]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if (value := _dict_value_type(arg)) is not None:
                return value
    return None


def _resolve_path(cls: type[BaseModel], path: list[str], full: str) -> list[tuple[Any, Any]]:
    """For each component of the dotted `path`, its (annotation, default value).

    Components walk through nested config models and into `dict[str, V]` fields, whose
    keys are free (`synth.mix.math=0.3` sets one weight of a mix).
    """
    steps: list[tuple[Any, Any]] = []
    current: Any = cls
    for i, part in enumerate(path):
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                raise ConfigError(f"override {full}: unknown key {'.'.join(path[: i + 1])}")
            default = None if field.is_required() else field.get_default(call_default_factory=True)
            current = field.annotation
        elif (value_type := _dict_value_type(current)) is not None:
            default, current = None, value_type
        else:
            raise ConfigError(f"override {full}: {'.'.join(path[:i])} has no sub-keys")
        steps.append((current, default))
    return steps


def _parse_value(annotation: Any, raw: str, key: str) -> Any:
    """Parse a command-line string for a field: first as-is (lax coercion), then as JSON."""
    adapter = TypeAdapter(annotation)
    candidates: list[Any] = []
    if raw.lower() in ("none", "null"):
        candidates.append(None)
    candidates.append(raw)
    try:
        candidates.append(json.loads(raw))
    except json.JSONDecodeError:
        pass
    last: ValidationError | None = None
    for c in candidates:
        try:
            return adapter.validate_python(c)
        except ValidationError as e:
            last = e
    assert last is not None
    raise ConfigError(f"override {key}={raw}: {_format_validation_error(last)}") from None


def apply_overrides(
    cls: type[M], data: Mapping[str, Any], overrides: Sequence[str], *, source: str = "config"
) -> M:
    """Apply `a.b=value` overrides to raw config data and validate the result."""
    merged: dict[str, Any] = json.loads(json.dumps(dict(data), default=list))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        key, raw = item.split("=", 1)
        path = [p for p in key.strip().split(".") if p]
        if not path:
            raise ConfigError(f"override {item!r}: empty key")
        steps = _resolve_path(cls, path, key)
        value = _parse_value(steps[-1][0], raw.strip(), key)
        node = merged
        for part, (_, default) in zip(path[:-1], steps[:-1]):
            if not isinstance(node.get(part), dict):
                # Start from the field's default so one override keeps its siblings.
                node[part] = _plain(default) if isinstance(default, (BaseModel, dict)) else {}
            node = node[part]
        node[path[-1]] = value.model_dump() if isinstance(value, BaseModel) else value
    return validate(cls, merged, source=source)


def _plain(value: Any) -> Any:
    """A JSON-like copy of a config value (models dumped, tuples as lists)."""
    if isinstance(value, BaseModel):
        return json.loads(value.model_dump_json())
    return json.loads(json.dumps(value, default=list))


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), cls: type[M] = Config  # type: ignore[assignment]
) -> M:
    """Load a config from an optional TOML file plus `section.key=value` overrides."""
    data = load_toml(path) if path is not None else {}
    return apply_overrides(cls, data, overrides, source=str(path) if path else "config")


def to_toml_dict(cfg: BaseModel) -> dict[str, Any]:
    """A JSON/TOML-safe dump of a config (None values dropped, tuples as lists)."""
    return json.loads(cfg.model_dump_json(exclude_none=True))
