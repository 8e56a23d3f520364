"""Decimal addition of L-digit numbers, digits reversed (SPEC §2).

    prompt  a_0 … a_{L-1} + b_0 … b_{L-1} =      least significant digit first
    answer  c_0 … c_L                             a + b, L + 1 digits, reversed

Reversed digits let a causal model emit each answer digit after the digits (and the
carry) it depends on. Loss and exact-match accuracy on the L + 1 answer digits;
held-out (a, b) pairs never occur in training.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import (Example, Generated, ProbeTask, TaskConfig, draw_distinct, register_task,
                                    task_vocab)

DIGITS = tuple(str(d) for d in range(10))


class AdditionConfig(TaskConfig):
    digits: int = 3

    @model_validator(mode="after")
    def _check(self) -> "AdditionConfig":
        if not 1 <= self.digits <= 18:
            raise ValueError(f"digits must lie in [1, 18], got {self.digits}")
        space = 10 ** (2 * self.digits)
        if self.n_train + self.n_val + self.n_test > space:
            raise ValueError(f"n_train + n_val + n_test = {self.n_train + self.n_val + self.n_test} "
                             f"exceeds the {space} pairs of {self.digits}-digit numbers")
        return self


def reversed_digits(n: int, width: int) -> tuple[str, ...]:
    return tuple(str(n).zfill(width)[::-1])


def example(a: int, b: int, digits: int) -> Example:
    prompt = reversed_digits(a, digits) + ("+",) + reversed_digits(b, digits) + ("=",)
    return Example(prompt, reversed_digits(a + b, digits + 1))


def generate(cfg: AdditionConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 1])
    top = 10**cfg.digits

    def draw(r: np.random.Generator, _: int) -> Example:
        a, b = (int(x) for x in r.integers(0, top, size=2))
        return example(a, b, cfg.digits)

    tr, va, te = draw_distinct(draw, (cfg.n_train, cfg.n_val, cfg.n_test), rng, what="addition")
    return Generated(task_vocab(DIGITS, ("+", "=")), {"train": tr, "val": va, "test": te})


TASK = register_task(ProbeTask(
    "addition", AdditionConfig, generate, "decimal addition, reversed digits", label="Addition",
    full=("task.n_train=50000", "train.steps=3000"), quick=("task.n_train=20000", "train.steps=250"),
    paper={"mixit": "≈ standard"}, position=10))
