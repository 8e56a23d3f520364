"""The loader: batch contract, determinism, epochs without replacement, rank sharding, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sanlab.config import apply_overrides
from sanlab.data.loader import Loader
from sanlab.data.prepare import PrepareConfig, prepare
from sanlab.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("loader") / "d"
    cfg = apply_overrides(PrepareConfig, {}, ["tokens=8000", "seq_len=32", "vocab_size=300", "val_frac=0.15",
                                              "synth.people=20", "synth.cities=6"])  # fmt: skip
    prepare(cfg, out)
    return out


def _row_ids(loader: Loader, step: int) -> list[int]:
    return loader.rows_for_step(step).tolist()


def test_batch_follows_the_contract(data_dir: Path) -> None:
    loader = Loader(data_dir, batch_rows=6, seed=0)
    b = loader.batch(0)
    assert set(b) == {"inputs", "targets", "segment_ids", "region_ids", "loss_mask", "doc_ids"}
    for k, v in b.items():
        assert v.shape == (6, 32)
        assert v.dtype == (torch.bool if k == "loss_mask" else torch.long)
    assert (b["inputs"][:, 1:] == b["targets"][:, :-1]).all()  # targets are inputs shifted by one
    assert (b["segment_ids"][:, 0] == 0).all()  # segments restart in every row
    assert int(b["targets"].max()) < loader.vocab_size and int(b["region_ids"].max()) <= 3


def test_deterministic_in_seed_and_step(data_dir: Path) -> None:
    a, b = Loader(data_dir, batch_rows=4, seed=7), Loader(data_dir, batch_rows=4, seed=7)
    for step in (0, 5, 123):
        x, y = a.batch(step), b.batch(step)
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert _row_ids(Loader(data_dir, batch_rows=4, seed=8), 0) != _row_ids(a, 0)


def test_each_epoch_is_one_pass_without_replacement(data_dir: Path) -> None:
    loader = Loader(data_dir, batch_rows=4, seed=1)
    n = loader.n_rows
    stream = np.concatenate([loader.rows_for_step(s) for s in range(-(-3 * n // 4))])
    for e in range(3):
        assert sorted(stream[e * n : (e + 1) * n].tolist()) == list(range(n))
    assert stream[:n].tolist() != stream[n : 2 * n].tolist()  # a fresh permutation each epoch


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_are_disjoint_and_cover_the_epoch(data_dir: Path, world_size: int) -> None:
    single = Loader(data_dir, batch_rows=8, seed=3)
    ranks = [Loader(data_dir, batch_rows=8, seed=3, rank=r, world_size=world_size) for r in range(world_size)]
    steps = single.n_rows // 8
    for step in range(steps):
        parts = [_row_ids(r, step) for r in ranks]
        flat = [i for p in parts for i in p]
        assert len(set(flat)) == 8  # disjoint
        assert flat == _row_ids(single, step)  # together: the global batch, whatever the world size
    covered = {i for r in ranks for s in range(steps) for i in _row_ids(r, s)}
    assert len(covered) == steps * 8 and covered <= set(range(single.n_rows))


def test_resume_at_any_step(data_dir: Path) -> None:
    a = Loader(data_dir, batch_rows=4, seed=2)
    for _ in range(5):
        next(a)
    state = a.state_dict()
    expected = next(a)
    b = Loader(data_dir, batch_rows=4, seed=2)
    b.load_state_dict(state)
    got = next(b)
    assert all(torch.equal(expected[k], got[k]) for k in got)
    with pytest.raises(DataError, match="seed"):
        Loader(data_dir, batch_rows=4, seed=9).load_state_dict(state)


def test_validation_rows_are_fixed_and_independent_of_the_training_seed(data_dir: Path) -> None:
    a = Loader(data_dir, split="val", batch_rows=2, seed=0)
    b = Loader(data_dir, split="val", batch_rows=2, seed=99)
    xa = [x["inputs"] for x in a.eval_batches(5)]
    xb = [x["inputs"] for x in b.eval_batches(5)]
    assert sum(len(x) for x in xa) == min(5, a.n_rows)
    assert all(torch.equal(p, q) for p, q in zip(xa, xb))
    everything = torch.cat([x["inputs"] for x in a.eval_batches()])
    assert len(everything) == a.n_rows
    halves = [Loader(data_dir, split="val", batch_rows=2, rank=r, world_size=2) for r in range(2)]
    split = sum(len(x["inputs"]) for h in halves for x in h.eval_batches())
    assert split == a.n_rows


def test_bad_loader_arguments(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="multiple of world_size"):
        Loader(data_dir, batch_rows=3, world_size=2)
    with pytest.raises(ConfigError, match="rank"):
        Loader(data_dir, rank=2, world_size=2, batch_rows=4)
    with pytest.raises(DataError, match="no split 'test'"):
        Loader(data_dir, split="test")
    with pytest.raises(DataError, match="not a prepared data dir"):
        Loader(tmp_path)


def test_regions_belong_to_the_target_token(data_dir: Path) -> None:
    """region_ids describe the token being predicted: the first token after `<think>` is
    trace, special-token targets are other, and a role header counts with its turn."""
    from sanlab.data.regions import (
        ANSWER, BOS_ID, END_THINK_ID, EOS_ID, IM_END_ID, IM_START_ID, OTHER, QUERY, THINK_ID, TRACE,
    )

    n_rows = Loader(data_dir, batch_rows=1, seed=0).n_rows
    b = Loader(data_dir, batch_rows=min(64, n_rows), seed=0).batch(0)
    regions, mask = b["region_ids"], b["loss_mask"]
    after_think = (b["inputs"] == THINK_ID) & mask
    assert after_think.any()
    assert (regions[after_think] == TRACE).all()
    special = torch.isin(b["targets"], torch.tensor([EOS_ID, IM_START_ID, IM_END_ID, THINK_ID, END_THINK_ID]))
    assert (regions[special & mask] == OTHER).all()
    assert (regions[(b["inputs"] == BOS_ID) & mask] == OTHER).all()  # BOS -> <|im_start|>
    after_start = (b["inputs"] == IM_START_ID) & mask  # `user` / `assistant` headers
    assert set(regions[after_start].tolist()) == {QUERY, ANSWER}
