"""Loss decomposition tables on hand-made per-token losses."""

from __future__ import annotations

import pytest
import torch

from sanlab.analysis import losses as L


def _table() -> L.TokenTable:
    return L.TokenTable(
        region=torch.tensor([0, 1, 1, 2, 2, 2, 3, 3]),
        exercise=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        position=torch.tensor([0, 1, 15, 16, 63, 64, 300, 2000]),
        token=torch.tensor([5, 5, 5, 9, 9, 7, 7, 3]),
        exercise_names=("math", "rag"),
    )


def test_group_table_shares() -> None:
    t = _table()
    loss = torch.tensor([1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 4.0, 4.0])
    rows = {r["group"]: r for r in L.group_table(loss, t.region, ("other", "query", "trace", "answer"))}
    assert rows["query"]["tokens"] == 2 and rows["query"]["token_share"] == 0.25
    assert rows["answer"]["loss"] == 4.0
    assert rows["answer"]["loss_share"] == pytest.approx(8.0 / 16.0)
    assert sum(r["token_share"] for r in rows.values()) == pytest.approx(1.0)
    assert sum(r["loss_share"] for r in rows.values()) == pytest.approx(1.0)


def test_region_deltas_sum_to_aggregate() -> None:
    t = _table()
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(8, generator=g), torch.rand(8, generator=g)
    out = L.compare(a, b, t, token_counts=torch.bincount(t.token, minlength=12))
    for key in ("region", "exercise", "position", "frequency"):
        ident = out[key]["identity"]
        assert ident["aggregate_delta"] == pytest.approx(float((a - b).double().mean()))
        assert ident["rel_error"] < 1e-9, key
    query = next(r for r in out["region"]["rows"] if r["group"] == "query")
    assert query["delta"] == pytest.approx(float((a[1:3] - b[1:3]).double().mean()))


def test_identity_flags_tokens_outside_every_group() -> None:
    a, b = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])
    groups = torch.tensor([0, 7])  # id 7 belongs to no named group
    rows = L.delta_table(a, b, groups, ("only",))
    assert L.delta_identity(a, b, rows)["rel_error"] == pytest.approx(0.5)


def test_position_buckets() -> None:
    t = _table()
    ids = L.bucketize(t.position, L.POSITION_EDGES)
    assert ids.tolist() == [0, 0, 0, 1, 1, 2, 3, 4]
    assert L.bucket_names(L.POSITION_EDGES) == ("0-15", "16-63", "64-255", "256-1023", "1024+")


def test_frequency_ranks_and_buckets() -> None:
    counts = torch.tensor([0, 50, 3, 50, 7])
    assert L.frequency_ranks(counts).tolist() == [4, 0, 3, 1, 2]
    t = _table()
    names = L.groupings(t, torch.bincount(t.token, minlength=12))["frequency"][1]
    assert names[0] == "rank 1-10" and names[-1] == "rank 10001+"


def test_decompose_without_counts_has_no_frequency() -> None:
    t = _table()
    out = L.decompose(torch.ones(8), t)
    assert "frequency" not in out and out["loss"] == 1.0
    assert [r["group"] for r in out["exercise"]] == ["math", "rag"]


def test_bootstrap_interval_is_the_percentile_interval_of_resampled_means() -> None:
    """The interval is the 2.5 / 97.5 % quantiles of the means of 1000 resamples; for 4000
    independent draws that is mean ± 1.96·sd/√N to within a few percent, and the same
    seed gives the same interval."""
    torch.manual_seed(0)
    d = 0.3 + 2.0 * torch.randn(4000, dtype=torch.float64)
    lo, hi = L.bootstrap_interval(d)
    half = 1.96 * float(d.std()) / 4000 ** 0.5
    assert lo < float(d.mean()) < hi
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.08)
    assert (lo + hi) / 2 == pytest.approx(float(d.mean()), abs=0.1 * half)
    assert L.bootstrap_interval(d) == (lo, hi)
    assert L.bootstrap_interval(torch.full((50,), 0.25)) == pytest.approx((0.25, 0.25))


def test_compare_bounds_region_and_exercise_deltas_only() -> None:
    t = _table()
    a = torch.tensor([1.0, 2.0, 3.0, 1.0, 2.0, 1.0, 4.0, 5.0])
    b = torch.tensor([1.5, 1.0, 2.0, 1.0, 1.0, 2.0, 4.0, 3.0])
    cmp = L.compare(a, b, t)
    for grouping in ("region", "exercise"):
        for row in cmp[grouping]["rows"]:
            assert row["delta_lo"] <= row["delta"] <= row["delta_hi"]
    query = next(r for r in cmp["region"]["rows"] if r["group"] == "query")  # Δs +1, +1: no spread
    assert (query["delta_lo"], query["delta_hi"]) == pytest.approx((1.0, 1.0))
    assert all("delta_lo" not in r for r in cmp["position"]["rows"])
