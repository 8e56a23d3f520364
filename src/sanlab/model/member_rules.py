"""Which models can train as the members of one batched model (`sanlab.model.members`),
from their configs alone: no torch, so that a study's process can group its runs
(`sanlab.study.groups`) and `study plan` show the groups without importing it."""

from __future__ import annotations

from typing import Sequence

from sanlab.config import ModelConfig


def members_unsupported(cfg: ModelConfig, freeze: Sequence[str] = ()) -> str | None:
    """Why `cfg` cannot train as members (None: it can)."""
    layers = set(cfg.layer_mixers)
    if layers != {"softmax"}:
        return f"sequence mixers {sorted(layers)} (members run softmax attention only)"
    if cfg.state_mixer not in ("none", "swiglu"):
        return f"state mixer {cfg.state_mixer!r} (members run none or swiglu)"
    if not cfg.qk_norm:
        return "model.qk_norm=false"
    if cfg.sandwich_norm:
        return "model.sandwich_norm=true"
    if cfg.head_dim % 2:
        return "an odd head_dim"
    if freeze:
        return "train.freeze"
    return None


def same_architecture(a: ModelConfig, b: ModelConfig) -> bool:
    """Whether two model configs build the same module (members must)."""
    return a.model_dump() == b.model_dump()
