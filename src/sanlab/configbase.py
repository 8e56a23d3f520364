"""The config leaf: what every typed config in sanlab is built from, and nothing above it.

- `StrictModel`: unknown keys are errors, assignments validated, no NaN / ±inf anywhere;
- `validate(cls, data)`: pydantic's report as one line naming the key (`ConfigError`);
- `load_toml(path)` and `apply_overrides(cls, data, ["a.b=value", ...])`: the one
  override syntax, type-checked against the field it sets;
- token counts as the papers write them (`Tokens`, `parse_tokens`, `format_tokens`).

This module imports nothing of sanlab but `errors` and `fileio`, so every layer may use
it: the mixers' specs (`sanlab.model.mixers`) declare their options on it, and the run
config (`sanlab.config`), which validates a model against those specs, sits above them.
`from sanlab.config import X` keeps working for every name here.
"""

from __future__ import annotations

import collections.abc
import datetime
import json
import math
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError, model_validator

from sanlab.errors import ConfigError
from sanlab.fileio import read_toml

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
        count = float(m.group(1).replace("_", "")) * _SUFFIX.get(m.group(2).upper(), 1)
        if not math.isfinite(count):
            raise ValueError(f"not a token count: {value!r} (too large)")
        return int(round(count))
    return value


Tokens = Annotated[int, BeforeValidator(parse_tokens)]


def format_tokens(n: int) -> str:
    """Short form used in run ids and tables: 5000000000 -> '5B', 2500000 -> '2.5M'."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return str(n)


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN / ±inf inside `value` (dicts, lists, tuples)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, Mapping):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub, v in items:
        if (found := _non_finite(v, sub)) is not None:
            return found
    return None


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated, and no
    number anywhere in it (float fields, list items, dict values, free-form `Any` fields)
    may be NaN or ±inf.

    A string literal under a field is its description (`use_attribute_docstrings`): the
    configuration reference of the documentation is generated from these
    (`sanlab.configref`).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False,
                              use_attribute_docstrings=True)

    def __setattr__(self, name: str, value: Any) -> None:
        """A validated assignment that is refused leaves the config as it was (pydantic sets
        the field before the model's after-validators run, and kept the refused value)."""
        before = dict(self.__dict__)
        try:
            super().__setattr__(name, value)
        except ValidationError:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    @model_validator(mode="after")
    def _finite(self) -> "StrictModel":
        # Typed float fields are refused by pydantic itself (allow_inf_nan=False); this
        # catches the rest: `Any` values and containers of them (e.g. `matching.partner`).
        for name in type(self).model_fields:
            value = getattr(self, name)
            if not isinstance(value, BaseModel) and (found := _non_finite(value, name)) is not None:
                raise ValueError(f"{found[0]} must be a finite number, got {found[1]}")
        return self


def _in_range(cfg: BaseModel, **bounds: tuple[float, float | None]) -> None:
    """Refuse a field outside its closed range [lo, hi] (hi None: unbounded), naming it."""
    for key, (lo, hi) in bounds.items():
        v = getattr(cfg, key)
        if v < lo or (hi is not None and v > hi):
            where = f"lie in [{lo}, {hi}]" if hi is not None else f"be >= {lo}"
            raise ValueError(f"{key} must {where}, got {v}")


# --------------------------------------------------------------------------- loading


def _format_validation_error(err: ValidationError, prefix: str = "") -> str:
    errors = err.errors()
    # An unknown key explains the rest (a misspelt section also leaves a required one
    # missing), so it is reported first.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
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


def ffn_contradiction(ffn: Any, state_mixer: Any) -> str | None:
    """Why `ffn` and `state_mixer` written side by side contradict each other, or None.

    `ffn` is an input spelling of `state_mixer` (true: a state mixer, swiglu unless named;
    false: none). Given in different layers (a file, then the command line) the later one
    wins; given together in one they must agree: `ffn=true` with `state_mixer="none"`
    (or `ffn=false` with a state mixer) says two things, and neither is taken silently."""
    if not isinstance(ffn, bool) or not isinstance(state_mixer, str):
        return None
    if ffn and state_mixer == "none":
        return f"ffn=true contradicts state_mixer={state_mixer} (no state mixer): give one of them"
    if not ffn and state_mixer != "none":
        return f"ffn=false contradicts state_mixer={state_mixer}: give one of them"
    return None


def _check_ffn_tables(node: Any, source: str, where: str = "") -> None:
    """Refuse a table of a config file that sets `ffn` and `state_mixer` against each other."""
    if isinstance(node, dict):
        if "ffn" in node and "state_mixer" in node and (why := ffn_contradiction(node["ffn"], node["state_mixer"])):
            raise ConfigError(f"{source}: {where.rstrip('.') or 'model'}: {why}")
        for k, v in node.items():
            _check_ffn_tables(v, source, f"{where}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_ffn_tables(v, source, f"{where}{i}.")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, with a one-line error for a missing or malformed file (or a model
    table whose `ffn` contradicts its `state_mixer`)."""
    data = read_toml(path, ConfigError)
    _check_ffn_tables(data, str(path))
    return data


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
            # With its metadata: `tokens: Tokens` keeps Tokens' parser only there (pydantic
            # moves a field's own Annotated[...] into `metadata`), so `sweep.tokens=30K`
            # reads as the same text does in a file.
            current = field.rebuild_annotation()
        elif (value_type := _dict_value_type(current)) is not None:
            default, current = None, value_type
        else:
            raise ConfigError(f"override {full}: {'.'.join(path[:i])} has no sub-keys")
        steps.append((current, default))
    return steps


_VALUE_CONFIG = ConfigDict(allow_inf_nan=False)  # a bare field type parses as strictly as in its model


def bare_words(raw: str) -> list[str] | None:
    """`[qk, mlp]` as ["qk", "mlp"]: a list of unquoted words, which is what a shell leaves
    of `["qk", "mlp"]` inside a quoted argument. None for anything else."""
    m = re.fullmatch(r"\[([^\[\]\"'{}]*)\]", raw.strip())
    return None if m is None else [w.strip() for w in m.group(1).split(",") if w.strip()]


def _toml_value(raw: str) -> list[Any]:
    """`raw` as the one value of a TOML assignment, when it is one of JSON's kinds; else []."""
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except (tomllib.TOMLDecodeError, RecursionError):
        return []
    value = parsed.get("v")
    plain = isinstance(value, (bool, int, float, str, list, dict)) and set(parsed) == {"v"}
    return [value] if plain and not (isinstance(value, float) and not math.isfinite(value)) else []


def _parse_value(annotation: Any, raw: str, key: str) -> Any:
    """Parse a command-line string for a field: first as-is (lax coercion), then as JSON,
    then as a TOML value (so `[0.5, nan]` means what it means in a file, and is refused)."""
    strict_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    adapter = TypeAdapter(annotation) if strict_model else TypeAdapter(annotation, config=_VALUE_CONFIG)
    candidates: list[Any] = []
    if raw.lower() in ("none", "null"):
        candidates.append(None)
    if annotation is Any:  # any text is valid as a string: read it as a file's value first (400 is a number)
        candidates += _toml_value(raw)
    candidates.append(raw)
    try:
        candidates.append(json.loads(raw))
    except (json.JSONDecodeError, RecursionError):
        pass
    try:  # TOML's value syntax too: the override means what the same text means in a file
        parsed = tomllib.loads(f"v = {raw}")
        if set(parsed) == {"v"}:  # one value, not a snippet smuggling in more keys
            candidates.append(parsed["v"])
    except (tomllib.TOMLDecodeError, RecursionError):
        pass
    words = bare_words(raw)
    if words is not None:
        candidates.append(words)
    last: ValidationError | None = None
    for c in candidates:
        try:
            return adapter.validate_python(c)
        except ValidationError as e:
            last = e
    assert last is not None
    either = _union_alternatives(last)
    if either is not None:
        raise ConfigError(f"override {key}={raw}: {either}") from None
    inner = bool(last.errors()[0]["loc"])  # an item of a list / dict value: name it in full
    raise ConfigError(f"override {key}={raw}: {_format_validation_error(last, key if inner else '')}") from None


def _union_alternatives(err: ValidationError) -> str | None:
    """A value that fits no member of a union field (`runner.members`: an integer or
    "auto") as one line naming every member: pydantic reports each member's refusal under
    a location of its own tag (`int`, `literal['auto']`), which is no key of the spec.
    None where the error is not that."""
    errors = err.errors()
    if len(errors) < 2 or any(len(e["loc"]) != 1 or not isinstance(e["loc"][0], str) for e in errors):
        return None
    lead = "Input should be "
    wants = [e["msg"][len(lead):] if e["msg"].startswith(lead) else e["msg"] for e in errors]
    return lead + " or ".join(dict.fromkeys(wants))


def apply_overrides(
    cls: type[M], data: Mapping[str, Any], overrides: Sequence[str], *, source: str = "config"
) -> M:
    """Apply `a.b=value` overrides to raw config data and validate the result."""
    try:
        merged: dict[str, Any] = json.loads(json.dumps(dict(data), default=_json_default))
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    given: dict[tuple[str, ...], Any] = {}  # dotted key -> the value this list sets
    for item in overrides:
        if not item.isprintable():  # a newline or another control character: never meant
            raise ConfigError(f"override {item!r}: contains a control character")
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
                # Start from the field's default so one override keeps its siblings; of a
                # model only what that default sets, so its other keys stay unset
                # (`optim.weight_decay=0.5` must not set the optim.name a study refuses).
                node[part] = (_plain(default.model_dump(mode="json", exclude_unset=True))
                              if isinstance(default, BaseModel) else _plain(default) if isinstance(default, dict) else {})
            node = node[part]
        node[path[-1]] = value.model_dump() if isinstance(value, BaseModel) else value
        given[tuple(path)] = node[path[-1]]
    for key, ffn in given.items():  # `ffn` and `state_mixer` on one command line must agree
        if key[-1] == "ffn" and (mixer := key[:-1] + ("state_mixer",)) in given:
            if why := ffn_contradiction(ffn, given[mixer]):
                raise ConfigError(f"overrides {'.'.join(key)}={str(ffn).lower()} and {'.'.join(mixer)}="
                                  f"{given[mixer]}: {why}")
    return validate(cls, merged, source=source)


def _json_default(value: Any) -> Any:
    """JSON for what TOML or a model can hold beyond JSON: tuples as lists, dates as text
    (which then fails the field's type check with a message naming the key)."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return list(value)


def _plain(value: Any) -> Any:
    """A JSON-like copy of a config value (models dumped, tuples as lists)."""
    if isinstance(value, BaseModel):
        return json.loads(value.model_dump_json())
    return json.loads(json.dumps(value, default=_json_default))


def to_toml_dict(cfg: BaseModel) -> dict[str, Any]:
    """A JSON/TOML-safe dump of a config (None values dropped, tuples as lists)."""
    return json.loads(cfg.model_dump_json(exclude_none=True))
