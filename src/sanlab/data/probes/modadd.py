"""Modular addition: every (a, b, (a + b) mod p), 95/5 train/held-out split (SPEC §2).

    prompt  a + b =       a, b each one token of the p residues
    answer  c             (a + b) mod p, one token

All p² pairs are shuffled with the seed; `train_frac` of them train, the rest is held
out and halved into `val` (the LR sweep selects on it) and `test` (reported). The paper
used p = 599; the default here is small enough for a CPU.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import Example, Generated, ProbeTask, TaskConfig, register_task, task_vocab


class ModAddConfig(TaskConfig):
    p: int = 97
    train_frac: float = 0.95

    @model_validator(mode="after")
    def _check(self) -> "ModAddConfig":
        if self.p < 2:
            raise ValueError(f"p must be at least 2, got {self.p}")
        if self.p > 65_000:
            raise ValueError(f"p must be at most 65000 (one token per residue), got {self.p}")
        if not 0.0 < self.train_frac < 1.0:
            raise ValueError(f"train_frac must lie in (0, 1), got {self.train_frac}")
        held = self.p**2 - int(round(self.train_frac * self.p**2))
        if held < 2 or held == self.p**2:
            raise ValueError(f"p={self.p} with train_frac={self.train_frac} leaves {held} of {self.p ** 2} "
                             "pairs held out; need at least 2 held out and 1 to train on")
        return self


def residue(n: int) -> str:
    return f"r{n}"


def example(a: int, b: int, p: int) -> Example:
    return Example((residue(a), "+", residue(b), "="), (residue((a + b) % p),))


def generate(cfg: ModAddConfig) -> Generated:
    """The split is the task's own (all pairs), so n_train / n_val / n_test are not used."""
    p = cfg.p
    order = np.random.default_rng([cfg.seed, 2]).permutation(p * p)
    n_train = int(round(cfg.train_frac * p * p))
    held = order[n_train:]
    n_val = len(held) // 2
    parts = {"train": order[:n_train], "val": held[:n_val], "test": held[n_val:]}
    splits = {s: [example(int(i) // p, int(i) % p, p) for i in idx] for s, idx in parts.items()}
    vocab = task_vocab((residue(i) for i in range(p)), ("+", "="))
    return Generated(vocab, splits, {"pairs": p * p})


TASK = register_task(ProbeTask(
    "modadd", ModAddConfig, generate, "modular addition mod p, 95/5 split", label="Mod. add.",
    full=("task.p=113", "train.steps=3000"), quick=("task.p=31", "train.steps=250"),
    paper={"mixit": "≈ standard"}, position=20))
