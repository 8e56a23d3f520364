"""The entropy floor of a generated corpus: how low any model's loss can go on it.

The embedded generator (`sanlab.data.synth`) draws every random choice through
`Draws`, which keeps −log p of each draw, charged to the region whose text expresses
it; a document's `draw_nats` are those sums. `sanlab prepare` adds them up per split,
region and exercise type and writes `entropy_floor.json` beside the manifest (the
manifest's `entropy_floor_file` names it). Not to be confused with the *noise floor* of
a study (the seed-to-seed spread of SPEC §1.4): this floor is a property of the data.

    floor_r = Σ_documents nats charged to region r / Σ_documents scored tokens of region r

in nats per token, the unit of the loss. *Scored* tokens are the ones a model predicts:
every token of a document except its BOS (the EOS counts, in region `other`).

What the number is. The generator writes its text so that the text determines every
draw (no two draw sequences give the same document), so −Σ log p(draw) = −log p(D) and
its mean over documents is the entropy H(D) of the document distribution. The world is
fixed, not drawn, so its facts cost nothing here. The tokenizer is a bijection between a
document and its token sequence (decode inverts the canonical encoding), so any model q
over tokens has E[−log q(tokens(D))] ≥ H(D): the floor is a lower bound on the mean
loss per token that *any* model can reach on these documents, scored whole with their
full context — reached only by a model that knows the world and the generator exactly.
It is nats per document divided by *this tokenizer's* token count, not an entropy rate
of the text: another tokenizer divides the same nats by another count. Had a draw been
invisible in the text, Σ −log p(draw) would exceed −log p(D) and the number would be an
upper bound on the entropy rather than a floor; that is why every draw must show (a
test changes each draw in turn and checks that the text changes, a necessary condition
checked on samples of every exercise type). The floor of a split
is a ratio over its documents, an estimate of E[nats] / E[tokens] whose sampling error
shrinks with the split; a run's mean loss over many tokens is the same kind of ratio.

Per region, the floor is the information first revealed in that region, so a model's
loss on the region's tokens is bounded by it given what came before. One boundary
effect: where a region ends (how many items a list has, whether an optional closing
sentence follows) is often only revealed by the marker token after it, so that little
information is charged to the region but paid on an `other` token (whose floor is 0).
The document total is exact. Packed rows cut documents at row edges (SPEC §1.5): a
continuation segment loses its earlier context, which can only raise the loss, and the
first token of each row is not scored (about 1/(seq_len+1) of all tokens).

`entropy_floor.json` (`tokens` are scored tokens, `nats` the draws' information,
`nats_per_token` = nats / tokens, the floor; null where there are no tokens):

    format "sanlab-entropy-floor", version 1, unit "nats per token"
    world        {people, cities, countries, facts, bits, bits_per_fact, attributes} of the planted
                 world (null for other corpora): its information content, facts × bits per fact
                 from the generator's own distributions (`World.information`); attributes:
                 {attr: {facts, values, bits_per_fact}}. Files written before bits were
                 recorded lack the last three.
    splits.{train,val}:
        documents, tokens, nats, nats_per_token                      the whole split
        region.{other,query,trace,answer}: tokens, nats, nats_per_token
        exercise.{type}: documents, tokens, nats, nats_per_token,
                         region.{other,query,trace,answer}: tokens, nats, nats_per_token

`rates(floor, split)` gives the per-(exercise, region) floors that the analysis uses to
compute the floor of any sample of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sanlab.data.regions import OTHER, REGION_NAMES
from sanlab.errors import DataError
from sanlab.fileio import read_json

FLOOR_FILE = "entropy_floor.json"
FLOOR_FORMAT = "sanlab-entropy-floor"
FLOOR_VERSION = 1
_R = len(REGION_NAMES)


def _entry(tokens: np.ndarray | int, nats: np.ndarray | float) -> dict[str, Any]:
    t, n = int(tokens), float(nats)
    return {"tokens": t, "nats": n, "nats_per_token": n / t if t else None}


class FloorCounter:
    """Adds up documents' draw information and scored tokens by exercise type and region."""

    def __init__(self) -> None:
        self.nats: dict[str, np.ndarray] = {}
        self.tokens: dict[str, np.ndarray] = {}
        self.documents: dict[str, int] = {}

    def add(self, exercise: str, regions: np.ndarray, draw_nats: Sequence[float]) -> None:
        """One document: its token regions (without BOS/EOS) and its `draw_nats`."""
        if len(draw_nats) != _R:
            raise ValueError(f"draw_nats has {len(draw_nats)} entries, expected {_R}")
        counts = np.bincount(np.asarray(regions, np.int64), minlength=_R)[:_R]
        counts[OTHER] += 1  # the EOS is a scored target; the BOS never is
        if exercise not in self.nats:
            self.nats[exercise] = np.zeros(_R)
            self.tokens[exercise] = np.zeros(_R, np.int64)
            self.documents[exercise] = 0
        self.nats[exercise] += np.asarray(draw_nats, np.float64)
        self.tokens[exercise] += counts
        self.documents[exercise] += 1

    def summary(self) -> dict[str, Any]:
        nats = sum(self.nats.values(), np.zeros(_R))
        tokens = sum(self.tokens.values(), np.zeros(_R, np.int64))
        return {
            "documents": sum(self.documents.values()),
            **_entry(tokens.sum(), nats.sum()),
            "region": {r: _entry(tokens[i], nats[i]) for i, r in enumerate(REGION_NAMES)},
            "exercise": {
                ex: {
                    "documents": self.documents[ex],
                    **_entry(self.tokens[ex].sum(), self.nats[ex].sum()),
                    "region": {r: _entry(self.tokens[ex][i], self.nats[ex][i]) for i, r in enumerate(REGION_NAMES)},
                }
                for ex in self.nats
            },
        }


def floor_document(splits: dict[str, FloorCounter], world: dict[str, int] | None) -> dict[str, Any]:
    """The content of `entropy_floor.json`."""
    return {
        "format": FLOOR_FORMAT,
        "version": FLOOR_VERSION,
        "unit": "nats per token",
        "world": world,
        "splits": {name: c.summary() for name, c in splits.items()},
    }


def load_floor(data_dir: str | Path) -> dict[str, Any] | None:
    """A prepared dir's `entropy_floor.json`, or None when the corpus has none (plain text)."""
    path = Path(data_dir) / FLOOR_FILE
    if not path.is_file():
        return None
    floor = read_json(path, DataError)
    if not isinstance(floor, dict) or floor.get("format") != FLOOR_FORMAT or floor.get("version") != FLOOR_VERSION:
        raise DataError(f"{path}: not a {FLOOR_FORMAT} v{FLOOR_VERSION} file")
    return floor


def rates(floor: dict[str, Any], split: str, exercises: Sequence[str]) -> np.ndarray:
    """(len(exercises), regions) floor in nats per token; 0 where a pair has no tokens.

    Rows follow `exercises` (the manifest's names); a type with no documents in the split
    has no tokens there either, so its row stays 0.
    """
    if split not in floor["splits"]:
        raise DataError(f"{FLOOR_FILE} has no split {split!r}")
    by_type = floor["splits"][split]["exercise"]
    out = np.zeros((len(exercises), _R))
    for i, ex in enumerate(exercises):
        for j, r in enumerate(REGION_NAMES):
            if ex in by_type:
                out[i, j] = by_type[ex]["region"][r]["nats_per_token"] or 0.0
    return out
