"""Probe arms: a name plus `section.key=value` overrides of the run config.

The presets are the standard and attention-only arms, then the registry's: one freeze
arm per target a mixer spec names in `probe_freeze` (`frozen_<target>`: the standard
architecture with `train.freeze=[target]`; SPEC §2's Frozen-QK and Frozen-MLP) and one
arm per registered sequence mixer whose spec names a probe arm (`SequenceSpec.probe_arm`:
the mixer in every layer of the standard architecture), so a variant that declares
either joins the suite without an edit here. A variant that this build does not have (its
mixer is not registered, or its config key does not exist) is refused with one line
naming the arm, before anything trains. A custom arm is given on the command line as
`--arm "NAME: key=value key=value"`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from sanlab.config import Config, apply_overrides
from sanlab.errors import ConfigError
from sanlab.model.mixers import MIXERS, STATE_MIXERS

# name -> (label as SPEC §2 names it in table rows, overrides). SPEC §2's variants are
# switches on the standard architecture.
_FIXED: dict[str, tuple[str, tuple[str, ...]]] = {
    "standard": ("Standard", ("model.ffn=true",)),
    "san": ("SAN", ("model.ffn=false",)),  # SPEC §1.1: attention only
}


def _presets() -> dict[str, tuple[str, tuple[str, ...]]]:
    freezes: dict[str, tuple[str, tuple[str, ...]]] = {}
    for spec in [*MIXERS.values(), *STATE_MIXERS.values()]:
        for target, label in spec.probe_freeze.items():
            freezes.setdefault(f"frozen_{target}", (label, ("model.ffn=true", f'train.freeze=["{target}"]')))
    mixers = {name: (spec.probe_arm, ("model.ffn=true", f"model.mixer={name}"))
              for name, spec in MIXERS.items() if spec.probe_arm and name not in _FIXED}
    return {**_FIXED, **freezes, **mixers}


PRESETS: dict[str, tuple[str, ...]] = {name: overrides for name, (_, overrides) in _presets().items()}
LABELS: dict[str, str] = {name: label for name, (label, _) in _presets().items()}


RUN_SECTIONS = ("model", "optim", "train")  # what an arm (or a run override) may set


def data_override(item: str) -> ConfigError:
    """The one refusal of a `data.*` override, on the command line or in an arm: the probe
    writes its own data, so its row length and data dir come from the task."""
    return ConfigError(f"override {item}: the probe writes its own data (data.* is not settable)")


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        return LABELS.get(self.name, self.name)


def parse_custom(spec: str) -> Arm:
    """`"NAME: key=value key=value"` -> Arm."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"--arm {spec!r}: expected 'NAME: section.key=value …' with a plain NAME")
    try:
        items = tuple(shlex.split(rest))
    except ValueError as e:
        raise ConfigError(f"--arm {spec!r}: {e}") from None
    if not items or any("=" not in i for i in items):
        raise ConfigError(f"--arm {spec!r}: expected section.key=value overrides after the name")
    for item in items:
        section = item.split("=", 1)[0].split(".", 1)[0].strip()
        if section == "data":
            raise ConfigError(f"--arm {spec!r}: {data_override(item)}")
        if section not in RUN_SECTIONS:
            raise ConfigError(f"--arm {spec!r}: override {item}: an arm sets {', '.join(s + '.*' for s in RUN_SECTIONS)} "
                              "only (task.*, sweep.*, … apply to every arm: give them on the command line)")
    return Arm(name, items)


def resolve_arms(names: Sequence[str], custom: Sequence[str] = ()) -> list[Arm]:
    """Preset names plus custom arms, in order, no duplicates; unknown names are refused."""
    arms: list[Arm] = []
    for n in names:
        n = n.strip()
        if not n:
            continue
        if n not in PRESETS:
            raise ConfigError(f"unknown arm {n!r} (presets: {', '.join(PRESETS)}; "
                              "or define one with --arm 'NAME: key=value …')")
        arms.append(Arm(n, PRESETS[n]))
    for spec in custom:
        arms.append(parse_custom(spec))
    seen: set[str] = set()
    for a in arms:
        if a.name in seen:
            raise ConfigError(f"arm {a.name!r} given twice")
        seen.add(a.name)
    if not arms:
        raise ConfigError("no arms to run")
    return arms


def unavailable(arm: Arm) -> str | None:
    """Why this build cannot run `arm` (a missing variant), or None."""
    try:
        apply_overrides(Config, {}, arm.overrides, source=f"arm {arm.name}")
    except ConfigError as e:
        if "unknown key" in str(e):
            key = str(e).split("unknown key", 1)[1].strip()
            return f"arm {arm.name}: variant not available in this build ({key} is not a config key)"
        if "unknown sequence mixer" in str(e):  # config validation reads the registry
            why = str(e).split("unknown sequence mixer", 1)[1].strip()
            return f"arm {arm.name}: variant not available in this build (sequence mixer {why})"
        raise ConfigError(f"arm {arm.name}: {e}") from None
    return None


def check_available(arms: Sequence[Arm]) -> None:
    for a in arms:
        why = unavailable(a)
        if why:
            raise ConfigError(why)


def available_presets() -> list[Arm]:
    """Every preset this build can run (the suite's default arms)."""
    return [Arm(n, o) for n, o in PRESETS.items() if unavailable(Arm(n, o)) is None]
