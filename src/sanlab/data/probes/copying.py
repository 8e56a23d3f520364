"""Copying: a random string, a separator, then the same string again (SPEC §2's retrieval
family; docs/commands/probe.md, "Copying").

    prompt  c_1 c_2 … c_n |
    answer  c_1 c_2 … c_n

The n symbols are drawn uniformly and independently (repeats allowed) from an alphabet
of `symbols`, and n is uniform in [n_min, n_max]. Loss and exact-match accuracy are on
the n copied tokens only (the answer region); an example is correct when every copied
token is. Nothing about a string can be memorised: each answer token must be read back
from the position n + 1 tokens earlier, which attention does by position and a fixed
mixing matrix cannot for every length at once.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import (Example, Generated, ProbeTask, TaskConfig, draw_distinct, register_task,
                                    task_vocab)

SEPARATOR = "|"


class CopyingConfig(TaskConfig):
    n_min: int = 4  # shortest string
    n_max: int = 12  # longest string
    symbols: int = 16  # alphabet of the string

    @model_validator(mode="after")
    def _check(self) -> "CopyingConfig":
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}")
        if self.symbols < 2:
            raise ValueError(f"symbols must be at least 2, got {self.symbols}")
        if self.n_max > 512:
            raise ValueError(f"n_max must be at most 512 (a document is 2·n + 3 tokens), got {self.n_max}")
        return self


def generate(cfg: CopyingConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 8])

    def draw(r: np.random.Generator, _: int) -> Example:
        n = int(r.integers(cfg.n_min, cfg.n_max + 1))
        string = tuple(f"c{int(s)}" for s in r.integers(0, cfg.symbols, size=n))
        return Example((*string, SEPARATOR), string)

    tr, va, te = draw_distinct(draw, (cfg.n_train, cfg.n_val, cfg.n_test), rng, what="copying")
    return Generated(task_vocab((f"c{i}" for i in range(cfg.symbols)), (SEPARATOR,)),
                     {"train": tr, "val": va, "test": te})


TASK = register_task(ProbeTask(
    "copying", CopyingConfig, generate, "reproduce a random string after a separator", label="Copying",
    full=("task.n_train=50000", "train.steps=3000"), quick=("task.n_train=20000", "train.steps=250"),
    position=45, suite=False))
