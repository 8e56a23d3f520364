"""Memorization capacity in bits per trainable parameter (SPEC §2).

For a sweep over N (pairs to memorise), capacity = max over the sweep of

    memorised(N) · log2(alphabet) / trainable parameters

where memorised(N) is the number of training pairs whose label the model predicts
exactly. Trainable parameters are the elements the optimizer updates: the run's
parameter routing (`meta.json` → `routing`) summed over every group except `frozen`
(parameters with `requires_grad=False`; a frozen variant puts its fixed weights there,
and fixed buffers such as a random mixing matrix are not parameters at all). The tied
embedding / head matrix counts once. SPEC §2 anchors: standard 2.98, Frozen-QK 2.25,
MixiT 2.18, Frozen-MLP 1.13 bits/param.

Two readings come with the number. When the best point memorised every one of its N
pairs the sweep never reached the model's limit, so the value is only a lower bound
(`lower_bound`: a larger N would give more). And an unmemorised label is still right by
chance 1/alphabet of the time: `chance` is that expected count at the best point, the
part of `memorised` a model with no memory at all would score (the measure counts it,
as the paper's formula does).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from torch import nn

from sanlab.train.optim import route


def trainable_params(model: nn.Module) -> int:
    """Elements the optimizer updates: the routing table minus its `frozen` group."""
    return sum(p.numel() for g, members in route(model).items() if g != "frozen" for _, p in members)


def trainable_from_meta(meta: Mapping[str, Any]) -> int:
    """The same count from a run's meta.json (elements per routing group)."""
    routing = meta.get("routing") or {}
    return int(sum(v for g, v in routing.items() if g != "frozen"))


def bits(memorised: int, alphabet: int) -> float:
    """Information in `memorised` uniformly random labels of an `alphabet`-letter alphabet."""
    return memorised * math.log2(alphabet)


def capacity(points: Sequence[Mapping[str, Any]], alphabet: int, params: int) -> dict[str, Any]:
    """Bits per parameter from sweep points `{"n": N, "memorised": k}`: the max over the sweep.

    Returns `{"bits_per_param", "n", "memorised", "bits", "params", "lower_bound", "chance"}`
    of the best point (`bits_per_param` None when no point finished).
    """
    if params <= 0:
        raise ValueError(f"trainable parameters must be positive, got {params}")
    if alphabet < 2:
        raise ValueError(f"the label alphabet must have at least 2 letters, got {alphabet}")
    best: dict[str, Any] = {"bits_per_param": None, "n": None, "memorised": None, "bits": None, "params": params,
                            "lower_bound": None, "chance": None}
    for p in points:
        if p.get("memorised") is None:
            continue
        b = bits(int(p["memorised"]), alphabet)
        if best["bits"] is None or b > best["bits"]:
            best = {"bits_per_param": b / params, "n": p["n"], "memorised": int(p["memorised"]),
                    "bits": b, "params": params, "lower_bound": int(p["memorised"]) >= int(p["n"]),
                    "chance": int(p["n"]) / alphabet}
    return best
