"""A run's config before it runs, without torch: what its `auto` settings resolve to
(`resolve`), how its length maps onto steps (`make_plan`), and which runs can train as the
members of one model (`group_unsupported`). The trainers use these; a study's process uses
them to group its runs (`sanlab.study.groups`), and `study plan` to show the groups, neither
importing torch for it (~2.5 s of a study's start, and most of `study plan`'s time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sanlab.config import Config
from sanlab.errors import ConfigError
from sanlab.model.member_rules import members_unsupported, same_architecture
from sanlab.train.host import cuda_available, resolve_precision

# What may differ between members' optimizer configs (the rest must be equal).
PER_MEMBER_OPTIM = ("lr", "adam_lr", "weight_decay", "grad_clip", "schedule", "warmup_frac", "decay_frac",
                    "final_lr_frac")
# What may differ between members' train configs.
PER_MEMBER_TRAIN = ("seed", "milestones")


def resolve_compile(setting: bool | str, device: str) -> bool:
    """`train.compile` as it will run on `device` ("cuda" or "cpu"): auto is on for CUDA
    (where inductor doubled the standard arm's speed on an H200: docs/gpu.md) and off on
    the CPU, where the hand-written kernels already run fused and a compile costs more
    than most CPU runs last; true and false as given."""
    if setting == "auto":
        return device == "cuda"
    return bool(setting)


def resolve(cfg: Config) -> Config:
    """Replace `auto` device, precision and compile with what will run (recorded in config.json)."""
    t = cfg.train
    device = t.device
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    elif device == "cuda" and not cuda_available():
        raise ConfigError("train.device=cuda but no CUDA device is available")
    return cfg.model_copy(update={
        "train": t.model_copy(update={"device": device, "precision": resolve_precision(t.precision, device),
                                      "compile": resolve_compile(t.compile, device)}),
        "optim": cfg.optim.model_copy(update={"ns_precision": resolve_precision(cfg.optim.ns_precision, device)}),
    })


@dataclass(frozen=True)
class Plan:
    """How the configured length and batch map onto steps, ranks and micro-batches."""

    steps: int
    tokens_per_step: int
    rank_rows: int  # rows per rank per step
    micro_rows: int  # rows per forward/backward
    accum: int  # micro-batches per step
    milestones: dict[int, int]  # step -> percent of training


def make_plan(cfg: Config, world_size: int) -> Plan:
    t, seq_len = cfg.train, cfg.data.seq_len
    tokens_per_step = t.batch_rows * seq_len
    if t.steps is not None:
        steps = t.steps
    elif t.tokens is not None:
        steps = math.ceil(t.tokens / tokens_per_step)
    else:
        raise ConfigError("set the training length: train.tokens=N or train.steps=N")
    if t.batch_rows % world_size:
        raise ConfigError(f"train.batch_rows={t.batch_rows} is not divisible by {world_size} processes")
    rank_rows = t.batch_rows // world_size
    micro = min(t.micro_batch_rows or rank_rows, rank_rows)
    if rank_rows % micro:
        raise ConfigError(f"train.micro_batch_rows={micro} does not divide the per-process batch of {rank_rows} rows")
    milestones = {round(m * steps): round(m * 100) for m in sorted(t.milestones)}
    return Plan(steps, tokens_per_step, rank_rows, micro, rank_rows // micro, milestones)


def group_unsupported(cfgs: Sequence[Config]) -> str | None:
    """Why these (resolved) configs cannot train as the members of one model (None: they can)."""
    first = cfgs[0]
    why = members_unsupported(first.model, first.train.freeze)
    if why is not None:
        return why
    plan = make_plan(first, 1)
    for c in cfgs[1:]:
        if not same_architecture(c.model, first.model):
            return "the members' model configs differ"
        if c.data.seq_len != first.data.seq_len:
            return "the members' data.seq_len differ"
        if (make_plan(c, 1).steps, make_plan(c, 1).micro_rows) != (plan.steps, plan.micro_rows) \
                or c.train.batch_rows != first.train.batch_rows:
            return "the members' plans (steps, batch rows) differ"
        o1, o2 = (o.model_dump(exclude=set(PER_MEMBER_OPTIM)) for o in (first.optim, c.optim))
        if o1 != o2:
            return "the members' optimizer configs differ beyond LR, decay and schedule"
        skip = set(PER_MEMBER_TRAIN) | {"steps", "tokens"}
        if c.train.model_dump(exclude=skip) != first.train.model_dump(exclude=skip):
            return "the members' train configs differ beyond seed and milestones"
    if first.train.compile:
        return "train.compile"
    return None
