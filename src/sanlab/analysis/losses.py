"""Loss decomposition: where, token by token, one run is better than another (SPEC §1.6).

All functions take per-token losses of the *same* evaluation tokens (loss-masked targets
of a fixed held-out sample, flattened in one order) and a group id per token: a region,
an exercise type, a position bucket or a token-frequency bucket.

Because the groups partition the tokens, the aggregate Δ is exactly the token-weighted
sum of the group Δs; `delta_identity` reports how closely the tables reproduce it, which
catches tokens that fell in no group (an unknown region id) as well as rounding.

Where the data dir has an entropy floor (`sanlab.data.floor`), `add_entropy_floor`
sets each region / exercise row's floor on the same tokens beside its loss: the loss
above it is the reducible part the architectures compete for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sanlab.data.regions import REGION_NAMES

POSITION_EDGES: tuple[int, ...] = (0, 16, 64, 256, 1024)
# The paired Δ of a region / exercise group gets a per-token bootstrap interval (what the
# report draws where one seed pair is all there is).
BOOTSTRAP_GROUPINGS: tuple[str, ...] = ("region", "exercise")
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_LEVEL = 0.95
FREQUENCY_RANK_EDGES: tuple[int, ...] = (0, 10, 100, 1000, 10000)


@dataclass(frozen=True)
class TokenTable:
    """Per-token attributes of an evaluation sample, flattened over loss-masked targets.

    region: (N,) region id of the target token (`sanlab.data.regions`);
    exercise: (N,) index into `exercise_names` of the target's document;
    position: (N,) position of the target inside its segment (how much context it has);
    token: (N,) target token id.
    """

    region: Tensor
    exercise: Tensor
    position: Tensor
    token: Tensor
    exercise_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.region.numel())


def bucket_names(edges: tuple[int, ...], fmt: str = "{lo}-{hi}") -> tuple[str, ...]:
    """Human names of half-open integer buckets [edges[i], edges[i+1]) and a last open one."""
    names = [fmt.format(lo=lo, hi=hi - 1) for lo, hi in zip(edges, edges[1:])]
    return (*names, f"{edges[-1]}+")


def bucketize(values: Tensor, edges: tuple[int, ...]) -> Tensor:
    """Bucket index of each value for buckets [edges[i], edges[i+1]), the last open-ended."""
    bounds = torch.tensor(edges[1:], dtype=values.dtype, device=values.device)
    return torch.bucketize(values, bounds, right=True)


def frequency_ranks(counts: Tensor) -> Tensor:
    """Rank of each token id by frequency (0 = most frequent); ties broken by id. (V,) -> (V,)."""
    order = torch.argsort(-counts.to(torch.float64), stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    return ranks


def group_table(loss: Tensor, groups: Tensor, names: tuple[str, ...]) -> list[dict]:
    """Per group: tokens, token share, mean loss, share of the summed loss.

    loss, groups: (N,). Groups with no tokens are left out.
    """
    loss = loss.to(torch.float64)
    n, total = loss.numel(), float(loss.sum())
    rows = []
    for g, name in enumerate(names):
        sel = groups == g
        k = int(sel.sum())
        if k == 0:
            continue
        s = float(loss[sel].sum())
        rows.append(
            {
                "group": name,
                "tokens": k,
                "token_share": k / n,
                "loss": s / k,
                "loss_share": s / total if total else float("nan"),
            }
        )
    return rows


def delta_table(loss_a: Tensor, loss_b: Tensor, groups: Tensor, names: tuple[str, ...], *,
                interval: bool = False) -> list[dict]:
    """Paired Δ = A − B per group on the same tokens.

    `weighted` = token_share · Δ is the group's contribution to the aggregate Δ;
    `contribution` its fraction of the aggregate. With `interval`, `delta_lo` and
    `delta_hi` bound Δ by a per-token bootstrap (`bootstrap_interval`).
    """
    if loss_a.shape != loss_b.shape:
        raise ValueError(f"paired losses differ in shape: {tuple(loss_a.shape)} vs {tuple(loss_b.shape)}")
    a, b = loss_a.to(torch.float64), loss_b.to(torch.float64)
    n = a.numel()
    agg = float((a - b).mean()) if n else float("nan")
    rows = []
    for g, name in enumerate(names):
        sel = groups == g
        k = int(sel.sum())
        if k == 0:
            continue
        la, lb = float(a[sel].mean()), float(b[sel].mean())
        weighted = k / n * (la - lb)
        row = {
            "group": name,
            "tokens": k,
            "token_share": k / n,
            "loss_a": la,
            "loss_b": lb,
            "delta": la - lb,
            "weighted": weighted,
            "contribution": weighted / agg if agg else float("nan"),
        }
        if interval:
            row["delta_lo"], row["delta_hi"] = bootstrap_interval(a[sel] - b[sel], seed=g)
        rows.append(row)
    return rows


def bootstrap_interval(diff: Tensor, samples: int = BOOTSTRAP_SAMPLES, level: float = BOOTSTRAP_LEVEL,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-token paired differences (N,):
    `samples` resamples of N tokens with replacement (a seeded generator: the same
    interval every time). Tokens are treated as independent, which they are not within a
    document, so the interval is a lower bound on the uncertainty of the group's Δ."""
    d = diff.to(torch.float64).flatten().cpu()
    n = d.numel()
    if n == 0:
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    chunk = max(1, min(samples, (1 << 22) // n))  # at most ~4M indices in memory at once
    means = []
    for start in range(0, samples, chunk):
        idx = torch.randint(n, (min(chunk, samples - start), n), generator=g)
        means.append(d[idx].mean(dim=1))
    m = torch.cat(means)
    alpha = (1 - level) / 2
    return float(torch.quantile(m, alpha)), float(torch.quantile(m, 1 - alpha))


def delta_identity(loss_a: Tensor, loss_b: Tensor, rows: list[dict]) -> dict:
    """Aggregate Δ against the token-weighted sum of a `delta_table`'s group Δs."""
    agg = float((loss_a.to(torch.float64) - loss_b.to(torch.float64)).mean())
    summed = sum(r["weighted"] for r in rows)
    err = abs(summed - agg)
    return {
        "aggregate_delta": agg,
        "weighted_sum": summed,
        "abs_error": err,
        "rel_error": err / abs(agg) if agg else (0.0 if err == 0 else float("inf")),
    }


def groupings(table: TokenTable, token_counts: Tensor | None) -> dict[str, tuple[Tensor, tuple[str, ...]]]:
    """Every grouping of the evaluation tokens the decomposition reports.

    `frequency` is by the target token's frequency rank in `token_counts` (counts per
    token id over the training split); it is absent when no counts are available.
    """
    out = {
        "region": (table.region, REGION_NAMES),
        "exercise": (table.exercise, table.exercise_names),
        "position": (bucketize(table.position, POSITION_EDGES), bucket_names(POSITION_EDGES)),
    }
    if token_counts is not None:
        ranks = frequency_ranks(token_counts)[table.token]
        names = tuple(
            f"rank {n}" for n in bucket_names(tuple(e + 1 for e in FREQUENCY_RANK_EDGES))
        )
        out["frequency"] = (bucketize(ranks, FREQUENCY_RANK_EDGES), names)
    return out


def decompose(loss: Tensor, table: TokenTable, token_counts: Tensor | None = None) -> dict:
    """One run's loss by every grouping, plus the mean over all evaluation tokens."""
    return {
        "tokens": len(table),
        "loss": float(loss.to(torch.float64).mean()) if len(table) else float("nan"),
        **{k: group_table(loss, g, names) for k, (g, names) in groupings(table, token_counts).items()},
    }


def compare(loss_a: Tensor, loss_b: Tensor, table: TokenTable, token_counts: Tensor | None = None) -> dict:
    """Paired Δ tables (A − B) by every grouping, each with its identity check."""
    out: dict = {"tokens": len(table)}
    for key, (g, names) in groupings(table, token_counts).items():
        rows = delta_table(loss_a, loss_b, g, names, interval=key in BOOTSTRAP_GROUPINGS)
        out[key] = {"rows": rows, "identity": delta_identity(loss_a, loss_b, rows)}
    return out


FLOOR_GROUPINGS: tuple[str, ...] = ("region", "exercise")


def token_entropy_floor(rates: Tensor, table: TokenTable) -> Tensor:
    """Per-token floor (N,) from a (exercises, regions) table of nats per token.

    Within one (exercise type, region) the floor is spread evenly over the tokens, so
    only groupings made of whole such cells (region, exercise type, and the aggregate)
    get an exact floor of the sample; position and frequency buckets do not.
    """
    return rates.to(torch.float64)[table.exercise, table.region]


def add_entropy_floor(decomposed: dict, token_floor: Tensor, table: TokenTable) -> dict:
    """Add `entropy_floor` and `loss_above_floor` to a `decompose` result (in place).

    At the top level for all tokens, and on every row of the region and exercise
    tables: the mean floor of the row's tokens and the row's loss minus it.
    """
    f = token_floor.to(torch.float64)
    decomposed["entropy_floor"] = float(f.mean()) if len(table) else float("nan")
    decomposed["loss_above_floor"] = decomposed["loss"] - decomposed["entropy_floor"]
    groups = groupings(table, None)
    for key in FLOOR_GROUPINGS:
        ids, names = groups[key]
        index = {n: g for g, n in enumerate(names)}
        for row in decomposed.get(key, []):
            sel = ids == index[row["group"]]
            row["entropy_floor"] = float(f[sel].mean())
            row["loss_above_floor"] = row["loss"] - row["entropy_floor"]
    return decomposed
