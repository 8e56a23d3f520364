"""Dyck-1: is a bracket string balanced? (SPEC §2)

    prompt  ( ( ) ( ) ) ?
    answer  yes | no

Half the examples are balanced (a random walk that never dips below zero and returns
to it); the other half are even-length strings that are not: a quarter of all examples
are uniform random strings, a quarter are balanced strings with one bracket flipped
(near misses, so counting alone does not suffice: a flip changes the count, a
prefix-depth check is needed for the random ones). Lengths are even, 2 … max_len.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import (Example, Generated, ProbeTask, TaskConfig, draw_distinct, register_task,
                                    task_vocab)


class DyckConfig(TaskConfig):
    max_len: int = 20
    min_len: int = 2

    @model_validator(mode="after")
    def _check(self) -> "DyckConfig":
        if self.min_len < 2 or self.min_len % 2 or self.max_len % 2 or self.max_len < self.min_len:
            raise ValueError(f"need even 2 <= min_len <= max_len, got min_len={self.min_len}, "
                             f"max_len={self.max_len}")
        return self


def is_balanced(s: tuple[str, ...]) -> bool:
    depth = 0
    for c in s:
        depth += 1 if c == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def _balanced(r: np.random.Generator, n: int) -> list[str]:
    out, depth = [], 0
    for i in range(n):
        left = n - i
        if depth == 0:
            c = "("
        elif depth == left:
            c = ")"
        else:
            c = "(" if r.random() < 0.5 else ")"
        depth += 1 if c == "(" else -1
        out.append(c)
    return out


def generate(cfg: DyckConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 6])
    lengths = np.arange(cfg.min_len, cfg.max_len + 1, 2)

    def draw(r: np.random.Generator, i: int) -> Example:
        n = int(r.choice(lengths))
        kind = i % 4  # 0, 2: balanced; 1: random unbalanced; 3: one flip
        if kind in (0, 2):
            s = _balanced(r, n)
        elif kind == 1:
            while True:
                s = ["(" if x else ")" for x in r.random(n) < 0.5]
                if not is_balanced(tuple(s)):
                    break
        else:
            s = _balanced(r, n)
            j = int(r.integers(0, n))
            s[j] = ")" if s[j] == "(" else "("
        return Example((*s, "?"), ("yes" if is_balanced(tuple(s)) else "no",))

    tr, va, te = draw_distinct(draw, (cfg.n_train, cfg.n_val, cfg.n_test), rng, what="dyck")
    return Generated(task_vocab(("(", ")", "?", "yes", "no")), {"train": tr, "val": va, "test": te})


TASK = register_task(ProbeTask(
    "dyck", DyckConfig, generate, "Dyck-1: balanced or not", label="Dyck-1",
    full=("task.n_train=10000", "train.steps=3000"), quick=("task.n_train=6000", "train.steps=250"),
    paper={"mixit": "≈ standard"}, position=60))
