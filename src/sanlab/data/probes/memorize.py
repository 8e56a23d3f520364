"""Memorization: N random input → label pairs; accuracy on the training set (SPEC §2).

    prompt  k_1 … k_L =      a random key of L symbols (distinct keys)
    answer  y                one of `alphabet` labels, uniform at random

Nothing in the key predicts the label, so every correct label is stored in the
weights: log2(alphabet) bits each. `val` and `test` are the training set itself, as the
capacity measure asks (`sanlab.probes.capacity`).
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import Column, Example, Generated, ProbeTask, TaskConfig, register_task, task_vocab


class MemorizeConfig(TaskConfig):
    """`n_train` is N, the number of pairs; `n_val` / `n_test` are not used (both = train)."""

    n_train: int = 1024
    alphabet: int = 16  # labels
    key_len: int = 4
    key_symbols: int = 16

    @model_validator(mode="after")
    def _check(self) -> "MemorizeConfig":
        if self.alphabet < 2:
            raise ValueError(f"alphabet must be at least 2 labels (a label of a 1-letter alphabet "
                             f"carries no information), got {self.alphabet}")
        if self.key_len < 1 or self.key_symbols < 2:
            raise ValueError("key_len must be at least 1 and key_symbols at least 2")
        space = self.key_symbols**self.key_len
        if self.n_train > space:
            raise ValueError(f"n_train={self.n_train} exceeds the {space} distinct keys "
                             f"({self.key_symbols} symbols ^ key_len {self.key_len})")
        return self


def generate(cfg: MemorizeConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 3])
    space = cfg.key_symbols**cfg.key_len
    codes = rng.choice(space, size=cfg.n_train, replace=False)
    labels = rng.integers(0, cfg.alphabet, size=cfg.n_train)
    examples = []
    for code, label in zip(codes, labels):
        key, c = [], int(code)
        for _ in range(cfg.key_len):
            key.append(f"k{c % cfg.key_symbols}")
            c //= cfg.key_symbols
        examples.append(Example((*key, "="), (f"y{int(label)}",)))
    vocab = task_vocab((f"k{i}" for i in range(cfg.key_symbols)), (f"y{i}" for i in range(cfg.alphabet)), ("=",))
    return Generated(vocab, {"train": examples, "val": examples, "test": examples},
                     {"alphabet": cfg.alphabet, "keys": space})


# The grid's memorization column is not this task's accuracy but its capacity: the task
# run at each N of `capacity.ns` (`sanlab.probes.capacity`), in bits per trainable parameter.
CAPACITY = Column("capacity", "Memorization bits/param",
                  "memorization capacity: task memorize swept over capacity.ns, bits/param",
                  paper={"standard": 2.98, "frozen_qk": 2.25, "mixit": 2.18, "frozen_mlp": 1.13})
TASK = register_task(ProbeTask(
    "memorize", MemorizeConfig, generate, "N random key -> label pairs (training-set accuracy)",
    split_disjoint=False, label="Memorize", full=("train.steps=3000",), quick=("train.steps=300",),
    position=30, suite=False, readings=(CAPACITY,)))
