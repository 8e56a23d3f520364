"""Sentiment-style classification from a lexicon, with negation (SPEC §2).

    prompt  the plot was not dull and the cast was great ?
    answer  pos | neg

A sentence mixes neutral filler words with 1 … `max_cues` cue words from a positive
and a negative lexicon; each cue is preceded by "not" with probability `negation`,
which flips its polarity. The label is the sign of the summed polarities (sentences
that sum to zero are redrawn), so the label is determined by the words present.
"""

from __future__ import annotations

import numpy as np
from pydantic import model_validator

from sanlab.data.probes.base import (Example, Generated, ProbeTask, TaskConfig, draw_distinct, register_task,
                                    task_vocab)

POSITIVE = ("good", "great", "fun", "moving", "clever", "superb", "warm", "sharp", "lovely", "brilliant",
            "gripping", "charming")
NEGATIVE = ("bad", "dull", "awful", "boring", "weak", "clumsy", "bland", "tedious", "messy", "lifeless",
            "silly", "grim")
NEUTRAL = ("the", "plot", "cast", "film", "story", "was", "and", "but", "ending", "music", "felt", "quite",
           "very", "script", "scenes", "director")
NOT = "not"


class SentimentConfig(TaskConfig):
    min_words: int = 4
    max_words: int = 12
    max_cues: int = 3
    negation: float = 0.3

    @model_validator(mode="after")
    def _check(self) -> "SentimentConfig":
        if not 1 <= self.max_cues <= self.min_words <= self.max_words:
            raise ValueError("need 1 <= max_cues <= min_words <= max_words")
        if not 0.0 <= self.negation <= 1.0:
            raise ValueError(f"negation must lie in [0, 1], got {self.negation}")
        return self


def polarity(words: tuple[str, ...]) -> int:
    """The summed polarity of a sentence: +1 per positive cue, -1 per negative, flipped after 'not'."""
    total = 0
    for i, w in enumerate(words):
        sign = 1 if w in POSITIVE else -1 if w in NEGATIVE else 0
        if sign and i > 0 and words[i - 1] == NOT:
            sign = -sign
        total += sign
    return total


def generate(cfg: SentimentConfig) -> Generated:
    rng = np.random.default_rng([cfg.seed, 7])

    def draw(r: np.random.Generator, _: int) -> Example:
        while True:
            n = int(r.integers(cfg.min_words, cfg.max_words + 1))
            cues = int(r.integers(1, cfg.max_cues + 1))
            words = [NEUTRAL[int(i)] for i in r.integers(0, len(NEUTRAL), size=n)]
            for pos in r.choice(n, size=cues, replace=False):
                lex = POSITIVE if r.random() < 0.5 else NEGATIVE
                words[pos] = lex[int(r.integers(0, len(lex)))]
            out: list[str] = []
            for w in words:
                if w in POSITIVE or w in NEGATIVE:
                    if r.random() < cfg.negation:
                        out.append(NOT)
                out.append(w)
            s = polarity(tuple(out))
            if s:
                return Example((*out, "?"), ("pos" if s > 0 else "neg",))

    tr, va, te = draw_distinct(draw, (cfg.n_train, cfg.n_val, cfg.n_test), rng, what="sentiment")
    vocab = task_vocab(POSITIVE, NEGATIVE, NEUTRAL, (NOT, "?", "pos", "neg"))
    return Generated(vocab, {"train": tr, "val": va, "test": te})


TASK = register_task(ProbeTask(
    "sentiment", SentimentConfig, generate, "lexicon sentiment with negation", label="Sentiment",
    full=("task.n_train=50000", "train.steps=3000"), quick=("task.n_train=20000", "train.steps=250"),
    paper={"mixit": "≈ standard"}, position=70))
