"""Checkpoints: exact round trip of weights, optimizer and RNG state; checksums; atomicity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from sanlab.config import ModelConfig, OptimConfig
from sanlab.errors import CheckpointError
from sanlab.model.lm import LM
from sanlab.train import checkpoint
from sanlab.train.optim import build_optimizers

CFG = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn=True)


def trained(name: str, steps: int = 2) -> tuple[LM, object]:
    torch.manual_seed(0)
    model = LM(CFG)
    opt = build_optimizers(model, OptimConfig(name=name))
    tokens = torch.randint(0, 64, (2, 8))
    for _ in range(steps):
        model(tokens).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def states_equal(a: dict, b: dict) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_round_trip_is_exact(tmp_path: Path, name: str) -> None:
    model, opt = trained(name)
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(5)
    checkpoint.save(tmp_path / "latest", model, opt, {"step": 2, "loader": {"pos": 4}})
    draws = (torch.rand(3), np.random.rand(3), random.random())

    fresh = LM(CFG)
    fresh_opt = build_optimizers(fresh, OptimConfig(name=name))
    state = checkpoint.load(tmp_path / "latest", fresh, fresh_opt)
    assert state["step"] == 2 and state["loader"] == {"pos": 4}
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    for a, b in zip(opt.optimizers, fresh_opt.optimizers):
        assert states_equal(a.state_dict(), b.state_dict())
    assert torch.equal(torch.rand(3), draws[0])  # every RNG continues where it was saved
    assert np.array_equal(np.random.rand(3), draws[1])
    assert random.random() == draws[2]
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob(".old-*"))


def test_no_pickle_anywhere(tmp_path: Path) -> None:
    model, opt = trained("muon")
    checkpoint.save(tmp_path / "c", model, opt, {"step": 0})
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "model.safetensors", "optim.safetensors", "state.json"]
    state = json.loads((tmp_path / "c" / "state.json").read_text())
    assert set(state["checksums"]) == {"model.safetensors", "optim.safetensors"}


def test_corrupt_file_is_refused(tmp_path: Path) -> None:
    model, opt = trained("adamw")
    checkpoint.save(tmp_path / "c", model, opt, {"step": 0})
    f = tmp_path / "c" / "optim.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        checkpoint.load(tmp_path / "c", LM(CFG))


def test_other_routing_is_refused(tmp_path: Path) -> None:
    model, opt = trained("muon")
    checkpoint.save(tmp_path / "c", model, opt, {"step": 0})
    other = LM(CFG)
    with pytest.raises(CheckpointError, match="optimizer"):
        checkpoint.load(tmp_path / "c", other, build_optimizers(other, OptimConfig(name="adamw")))
    with pytest.raises(CheckpointError, match="does not fit"):
        checkpoint.load(tmp_path / "c", LM(CFG.model_copy(update={"ffn": False})))


def test_replace_keeps_a_complete_copy(tmp_path: Path) -> None:
    """A crash between the two renames leaves `.old-latest`, which `find` falls back to."""
    model, opt = trained("muon")
    checkpoint.save(tmp_path / "latest", model, opt, {"step": 1})
    checkpoint.save(tmp_path / "latest", model, opt, {"step": 2})
    assert checkpoint.read_state(tmp_path / "latest")["step"] == 2
    (tmp_path / "latest").rename(tmp_path / ".old-latest")  # the state mid-replace
    found = checkpoint.find(tmp_path / "latest")
    assert found == tmp_path / ".old-latest" and checkpoint.read_state(found)["step"] == 2
    assert checkpoint.find(tmp_path / "missing") is None
