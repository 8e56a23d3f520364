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

Chance-free reading (`measure="fano"`). Counting every correct label as log2(A) bits
credits a model that knows nothing with N/A labels, N·log2(A)/A bits, which grows with
N: at N = 65536 and A = 16 that is 16,384 bits, 7 bits per parameter of a 2.3k-parameter
model. The information the predictions carry about the labels has a lower bound that
gives chance nothing (Fano's inequality, labels uniform and independent, accuracy a):

    I ≥ N · (log2 A − H₂(a) − (1 − a) · log2(A − 1)),   H₂(a) = −a log2 a − (1 − a) log2(1 − a)

which is 0 at a = 1/A and N·log2(A) at a = 1 (clipped at 0 below chance). The
predictions are a function of the weights and of the keys, which say nothing about the
labels, so the weights hold at least this many bits of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from torch import nn


def trainable_params(model: "nn.Module") -> int:
    """Elements the optimizer updates: the routing table minus its `frozen` group."""
    # lazy: torch (the optimizer's routing); records read the capacity formulas without it
    from sanlab.train.optim import route

    return sum(p.numel() for g, members in route(model).items() if g != "frozen" for _, p in members)


def trainable_from_meta(meta: Mapping[str, Any]) -> int:
    """The same count from a run's meta.json (elements per routing group)."""
    routing = meta.get("routing") or {}
    return int(sum(v for g, v in routing.items() if g != "frozen"))


def bits(memorised: int, alphabet: int) -> float:
    """Information in `memorised` uniformly random labels of an `alphabet`-letter alphabet."""
    return memorised * math.log2(alphabet)


def fano_bits(memorised: int, n: int, alphabet: int) -> float:
    """Fano's lower bound on the information `memorised` correct labels out of `n`
    (uniform over `alphabet` letters) carry: n·(log2 A − H₂(a) − (1 − a)·log2(A − 1)), a = k/n,
    0 at or below chance."""
    if n <= 0:
        return 0.0
    a = memorised / n
    if a <= 1.0 / alphabet:
        return 0.0
    h2 = -sum(x * math.log2(x) for x in (a, 1.0 - a) if x > 0)
    return max(0.0, n * (math.log2(alphabet) - h2 - (1.0 - a) * math.log2(alphabet - 1)))


MEASURES = ("count", "fano")  # memorised · log2(A) (the paper's form); Fano's chance-free bound


def capacity(points: Sequence[Mapping[str, Any]], alphabet: int, params: int,
             measure: str = "count") -> dict[str, Any]:
    """Bits per parameter from sweep points `{"n": N, "memorised": k}`: the max over the sweep.

    `measure`: "count" (memorised · log2(alphabet), chance included) or "fano" (the
    chance-free lower bound, `fano_bits`). Returns `{"bits_per_param", "n", "memorised",
    "bits", "params", "lower_bound", "chance", "measure"}` of the best point
    (`bits_per_param` None when no point finished). On a tie the smaller N is the best
    point, whatever order the points come in: the maximum is already reached there.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if params <= 0:
        raise ValueError(f"trainable parameters must be positive, got {params}")
    if alphabet < 2:
        raise ValueError(f"the label alphabet must have at least 2 letters, got {alphabet}")
    best: dict[str, Any] = {"bits_per_param": None, "n": None, "memorised": None, "bits": None, "params": params,
                            "lower_bound": None, "chance": None, "measure": measure}
    for p in sorted(points, key=lambda p: int(p["n"])):
        if p.get("memorised") is None:
            continue
        k, n = int(p["memorised"]), int(p["n"])
        b = bits(k, alphabet) if measure == "count" else fano_bits(k, n, alphabet)
        if best["bits"] is None or b > best["bits"]:
            best = {"bits_per_param": b / params, "n": p["n"], "memorised": k, "bits": b, "params": params,
                    "lower_bound": k >= n, "chance": n / alphabet, "measure": measure}
    return best
