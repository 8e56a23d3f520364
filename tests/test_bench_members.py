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
