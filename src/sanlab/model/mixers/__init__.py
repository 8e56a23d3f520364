"""Sequence and state mixers: one file per mixer, registered by name, found by the package.

A mixer file holds the mixer's **spec** (`spec.py`: options, parameters with shape, role
and init, FLOP terms, freeze targets; torch-free) above its first `import torch`, and its
**module** (`base.py`: the forward pass, and the hooks `prepare` and `decode_cache`)
below it:

    class WindowSpec(SoftmaxSpec):          # registered by the decorator
        name = "window"
        ...
    import torch
    class WindowAttention(SoftmaxAttention):
        spec = WindowSpec                   # the module that implements it
        def forward(self, u, ctx): ...

Every file in this package is found when the package is imported (`pkgutil`), so a new
mixer is one new file: nobody imports it by hand. The registry needs only the specs, and
so does whatever reads it (config validation at load, accounting, matching, the study's
tables, the report, the docs tables): importing this package runs each file up to its
first `import torch` and no further; the rest of a file runs the first time something
asks for a name defined there (building a model, `from …softmax import
SoftmaxAttention`). Above that line a file imports only torch-free modules;
tests/test_variants.py checks that every spec loads with torch blocked.

A mixer registered from outside sanlab is a spec class under `@register_mixer` and a
module class with `spec = ThatSpec`, in a file the user imports before the config is
loaded (config validation reads the registry).
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from sanlab.configbase import StrictModel
from sanlab.errors import ConfigError
from sanlab.model.mixers.spec import ROLES, MixerSpec, NoOptions, Param, Role, SequenceSpec, StateSpec

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # (sanlab.config imports this package: it validates against it)
    from sanlab.model.mixers.base import SequenceMixer, StateMixer

__all__ = ["MIXERS", "STATE_MIXERS", "ROLES", "MixerSpec", "NoOptions", "Param", "Role", "SequenceSpec",
           "StateSpec", "build_mixer", "build_state_mixer", "check_model", "mixer_class", "mixer_options",
           "mixer_spec", "register_mixer", "register_state_mixer", "state_mixer_class", "state_mixer_spec"]

# name -> spec class, in registration order
MIXERS: dict[str, type[SequenceSpec]] = {}
STATE_MIXERS: dict[str, type[StateSpec]] = {}
# spec class -> the module class that implements it (`spec = …` in the class body)
_MODULES: dict[type[MixerSpec], type] = {}

S = TypeVar("S", bound=type[MixerSpec])


def _register(registry: dict, kind: str) -> Callable[[S], S]:
    def wrap(spec: S) -> S:
        name = spec.__dict__.get("name")
        if not name:
            raise ValueError(f"{kind} spec {spec.__name__} sets no `name` of its own")
        if name in registry and registry[name] is not spec:
            raise ValueError(f"{kind} {name!r} registered twice ({registry[name].__name__}, {spec.__name__})")
        registry[name] = spec
        return spec

    return wrap


def register_mixer(spec: S) -> S:
    """Class decorator: register a sequence mixer's spec under its `name`."""
    if not issubclass(spec, SequenceSpec):
        raise TypeError(f"{spec.__name__}: a sequence mixer's spec subclasses SequenceSpec")
    if not spec.__dict__.get("short"):
        spec.short = spec.__dict__.get("name", "")
    return _register(MIXERS, "sequence mixer")(spec)


def register_state_mixer(spec: S) -> S:
    """Class decorator: register a state mixer's (FFN's) spec under its `name`."""
    if not issubclass(spec, StateSpec):
        raise TypeError(f"{spec.__name__}: a state mixer's spec subclasses StateSpec")
    return _register(STATE_MIXERS, "state mixer")(spec)


def implement(spec: type[MixerSpec], module: type) -> None:
    """Record `module` as the class that implements `spec` (called for every module class
    that sets `spec` in its body)."""
    other = _MODULES.get(spec)
    if other is not None and other is not module:
        raise ValueError(f"{spec.__name__} is implemented twice ({other.__qualname__}, {module.__qualname__})")
    _MODULES[spec] = module


# --------------------------------------------------------------------------- lookups


def mixer_spec(name: str) -> type[SequenceSpec]:
    spec = MIXERS.get(name)
    if spec is None:
        raise ConfigError(f"model.mixer: unknown sequence mixer {name!r} (known: {', '.join(MIXERS)})")
    return spec


def state_mixer_spec(name: str) -> type[StateSpec]:
    spec = STATE_MIXERS.get(name)
    if spec is None:
        raise ConfigError(f"model.state_mixer: unknown state mixer {name!r} (known: none, {', '.join(STATE_MIXERS)})")
    return spec


def mixer_options(cfg: ModelConfig, name: str) -> Any:
    """The typed options of mixer `name` in `cfg`: `model.mixer_options` belong to
    `model.mixer` and were validated once, with the config (`cfg.options`); any other
    mixer of the layout (softmax in a hybrid) gets its defaults."""
    if name == cfg.mixer:
        return cfg.options
    return mixer_spec(name).validate_options({}, source=f"model.mixer_options (mixer {name})")


def check_model(cfg: ModelConfig) -> StrictModel:
    """Every name in the layout, the state mixer and the mixer options are registered and
    valid (ConfigError naming the key otherwise); returns `model.mixer_options` typed by
    the mixer's spec (`Options`). `ModelConfig` runs this when it validates, so every
    config that exists has passed it, and keeps the options (`ModelConfig.options`)."""
    spec = mixer_spec(cfg.mixer)
    for name in cfg.layer_mixers:
        if name not in MIXERS:
            raise ConfigError(f"model.layout: unknown sequence mixer {name!r} (known: {', '.join(MIXERS)})")
    options = spec.validate_options(cfg.mixer_options, source=f"model.mixer_options (mixer {cfg.mixer})")
    for name in dict.fromkeys(cfg.layer_mixers):  # the layout's other mixers run on their defaults
        if name != cfg.mixer:
            mixer_spec(name).validate_options({}, source=f"model.mixer_options (mixer {name})")
    if cfg.state_mixer != "none":
        state_mixer_spec(cfg.state_mixer)
    return options


def _module_of(spec: type[MixerSpec], kind: str) -> type:
    if spec not in _MODULES:
        _complete(spec.__module__)  # the file's module part, below its `import torch`
    module = _MODULES.get(spec)
    if module is None:
        raise ConfigError(f"{kind} {spec.name}: no module implements it (a class with `spec = {spec.__name__}`)")
    return module


def mixer_class(name: str) -> type[SequenceMixer]:
    """The module class of sequence mixer `name` (loads its file's module part: torch)."""
    return _module_of(mixer_spec(name), "sequence mixer")


def state_mixer_class(name: str) -> type[StateMixer]:
    return _module_of(state_mixer_spec(name), "state mixer")


def build_mixer(cfg: ModelConfig, layer_idx: int) -> SequenceMixer:
    name = cfg.layer_mixers[layer_idx]
    return mixer_class(name)(cfg, layer_idx, mixer_options(cfg, name))


def build_state_mixer(cfg: ModelConfig, layer_idx: int) -> StateMixer:
    return state_mixer_class(cfg.state_mixer)(cfg, layer_idx, NoOptions())


# --------------------------------------------------------------------------- discovery

# Each file of this package in two parts: the spec part (up to the first top-level
# `import torch`) and the module part (the rest), compiled, by module name, until run.
_SPEC_PARTS: dict[str, types.CodeType] = {}
_MODULE_PARTS: dict[str, types.CodeType] = {}
_RUNNING: set[str] = set()  # spec parts being run (a name missing there is a cycle, not the module part's)


def _imports_torch(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "torch" or a.name.startswith("torch.") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and bool(node.module) and (node.module == "torch" or node.module.startswith("torch."))
    return False


def _run(parts: dict[str, types.CodeType], fullname: str) -> None:
    code = parts.pop(fullname, None)
    if code is None:
        return
    module = sys.modules[fullname]
    _RUNNING.add(fullname)
    try:
        exec(code, module.__dict__)  # noqa: S102 - this package's own source file
    finally:
        _RUNNING.discard(fullname)
    if fullname not in _SPEC_PARTS and fullname not in _MODULE_PARTS:
        module.__dict__.pop("__getattr__", None)  # complete: a plain module from now on


def _complete(fullname: str) -> None:
    """Run what is left of one of this package's files (nothing for any other module)."""
    _run(_SPEC_PARTS, fullname)
    _run(_MODULE_PARTS, fullname)


def _create(fullname: str, path: Path) -> None:
    """Module `fullname` from `path`, with neither part run yet: a name looked up on it
    runs the spec part, and the module part if the name is not defined there."""
    tree = ast.parse(path.read_text(), filename=str(path))
    cut = next((i for i, node in enumerate(tree.body) if _imports_torch(node)), len(tree.body))
    future = [n for n in tree.body[:cut] if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    spec = importlib.util.spec_from_file_location(fullname, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    _SPEC_PARTS[fullname] = compile(ast.Module(body=tree.body[:cut], type_ignores=[]), str(path), "exec",
                                    dont_inherit=True)
    if cut < len(tree.body):
        _MODULE_PARTS[fullname] = compile(ast.Module(body=[*future, *tree.body[cut:]], type_ignores=[]),
                                          str(path), "exec", dont_inherit=True)

    def __getattr__(attr: str) -> Any:
        if not attr.startswith("__"):
            _run(_SPEC_PARTS, fullname)
            if attr not in module.__dict__ and fullname not in _RUNNING:
                _run(_MODULE_PARTS, fullname)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {fullname!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = __getattr__
    sys.modules[fullname] = module
    setattr(sys.modules[__name__], fullname.rsplit(".", 1)[1], module)


def _discover() -> None:
    """Create every module of this package first (so one file's spec part may import
    another's), then run each spec part, in name order."""
    here = Path(__file__).parent
    names = [f"{__name__}.{info.name}" for info in pkgutil.iter_modules([str(here)]) if not info.ispkg]
    for fullname in names:
        if fullname not in sys.modules:
            _create(fullname, here / f"{fullname.rsplit('.', 1)[1]}.py")
    for fullname in names:
        _run(_SPEC_PARTS, fullname)


_discover()
