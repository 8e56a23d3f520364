"""Multi-hop induction: follow a chain of k pointers given in context.

    prompt  s_1 d_1 s_2 d_2 … s_P d_P | x_0
    answer  x_k                            x_0 → x_1 → … → x_k along the pairs

The context lists P pointer pairs "s → d" in random order, with distinct sources, so
the pointer map is a function. k + 1 distinct nodes x_0 … x_k form the chain; the other
P − k pairs are distractors whose sources are off the chain (they never change the
answer). One hop is associative recall; k hops need k lookups in sequence.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import (Example, Generated, ProbeTask, TaskConfig, draw_distinct, register_task,
                                    task_vocab)


class InductionConfig(TaskConfig):
    hops: int = 2
    pairs: int = 6  # pointer pairs in context (chain + distractors)
    nodes: int = 16  # node alphabet

    @model_validator(mode="after")
    def _check(self) -> "InductionConfig":
        if self.hops < 1:
            raise ValueError(f"hops must be at least 1, got {self.hops}")
        if self.pairs < self.hops:
            raise ValueError(f"pairs={self.pairs} cannot hold a chain of hops={self.hops}")
        if self.pairs > self.nodes or self.hops + 1 > self.nodes:
            raise ValueError(f"pairs={self.pairs} with distinct sources and a chain of {self.hops + 1} "
                             f"distinct nodes need more than nodes={self.nodes}")
        return self


def follow(pairs: list[tuple[str, str]], start: str, hops: int) -> str:
    """The node reached from `start` after `hops` pointer steps (the reference answer)."""
    table = dict(pairs)
    node = start
    for _ in range(hops):
        node = table[node]
    return node


def generate(cfg: InductionConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 5])

    def draw(r: np.random.Generator, _: int) -> Example:
        perm = [f"n{i}" for i in r.permutation(cfg.nodes)]
        chain = perm[: cfg.hops + 1]
        pairs = [(chain[i], chain[i + 1]) for i in range(cfg.hops)]
        # Distractor sources: nodes off the chain's sources (x_k may be one: its pointer is never used).
        sources = perm[cfg.hops :][: cfg.pairs - cfg.hops]
        pairs += [(s, f"n{int(r.integers(0, cfg.nodes))}") for s in sources]
        order = r.permutation(len(pairs))
        prompt: list[str] = []
        for i in order:
            prompt += list(pairs[i])
        return Example((*prompt, "|", chain[0]), (follow(pairs, chain[0], cfg.hops),))

    tr, va, te = draw_distinct(draw, (cfg.n_train, cfg.n_val, cfg.n_test), rng, what="induction")
    return Generated(task_vocab((f"n{i}" for i in range(cfg.nodes)), ("|",)), {"train": tr, "val": va, "test": te})


TASK = register_task(ProbeTask(
    "induction", InductionConfig, generate, "follow k pointers given in context", label="Induction",
    full=("task.n_train=50000", "train.steps=3000"), quick=("task.n_train=20000", "train.steps=250"),
    position=50))
