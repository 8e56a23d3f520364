"""benchmarks/bench_members.py times like with like: its members and its solo runs are the
same runs (same init, data, LRs and clip), so one step leaves them with the same weights."""

from __future__ import annotations

import torch


def test_members_and_solo_steppers_train_the_same_runs(load_benchmark, monkeypatch):
    bm = load_benchmark("bench_members")
    monkeypatch.setitem(bm.SHAPES, "tiny", dict(d=32, layers=2, heads=2, kv_heads=1, vocab=64, seq_len=16, batch=2,
                                                docs=2, ffn=True, partners=()))
    cfg = bm.arm_configs("tiny")["standard"]
    solo, members = bm.Solo(cfg, "tiny", 3, False), bm.Members(cfg, "tiny", 3, False)
    solo.step()
    members.step()
    for m, (model, _) in enumerate(solo.runs):
        for n, p in model.named_parameters():
            assert torch.equal(members.model.by_name[n][m], p.detach()), (m, n)


def test_the_partner_rows_are_the_partners(load_benchmark):
    """Each partner arm's row times that arm's matched config (the demo's: SAN 5L d64 against
    iso-param 1 standard layer, iso-FLOP 2, iso-depth 5), not the reference's or a neighbour's."""
    bm = load_benchmark("bench_members")
    arms = bm.arm_configs("demo")
    assert {a: (c.n_layers, c.state_mixer) for a, c in arms.items()} == {
        "san": (5, "none"), "iso_param": (1, "swiglu"), "iso_flop": (2, "swiglu"), "iso_depth": (5, "swiglu")}
