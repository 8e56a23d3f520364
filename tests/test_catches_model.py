"""RoPE positions restart at 0 at every document start, asserted on the positions themselves.

RoPE is relative: shifting every position of a document by a constant leaves its
attention scores unchanged in exact arithmetic, so comparing a packed row's logits with
each document alone sees a missing restart only as rounding noise (~1e-10 in float64).
Here the positions and the rotation tables the forward pass really uses are checked.
"""

from __future__ import annotations

import pytest
import torch

import sanlab.model.lm as lm_mod
from sanlab.config import ModelConfig
from sanlab.model.lm import LM

LENGTHS = [5, 9, 3, 7]
EXPECTED = [p for n in LENGTHS for p in range(n)]  # 0..4, 0..8, 0..2, 0..6


def _contexts(monkeypatch: pytest.MonkeyPatch) -> list:
    seen = []
    real = lm_mod.build_context

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        ctx = real(*args, **kwargs)
        seen.append(ctx)
        return ctx

    monkeypatch.setattr(lm_mod, "build_context", spy)
    return seen


@pytest.mark.parametrize("ffn", [False, True])
def test_the_forward_pass_restarts_rope_positions_per_document(ffn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, ffn=ffn)
    torch.manual_seed(0)
    model = LM(cfg)
    seen = _contexts(monkeypatch)
    T = sum(LENGTHS)
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(LENGTHS)])
    segs = torch.stack([seg, torch.zeros(T, dtype=torch.long)])  # row 2: one document
    model(torch.randint(0, 64, (2, T)), segs)
    assert len(seen) == 1
    ctx = seen[0]
    assert ctx.positions.tolist() == [EXPECTED, list(range(T))]
    # The rotation tables are those of the restarted positions: angle = position · θ^(−2i/d).
    d = cfg.head_dim
    inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    for row, positions in enumerate((EXPECTED, list(range(T)))):
        angles = torch.tensor(positions, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        torch.testing.assert_close(ctx.cos[row, :, 0].double(), angles.cos(), atol=1e-5, rtol=0)
        torch.testing.assert_close(ctx.sin[row, :, 0].double(), angles.sin(), atol=1e-5, rtol=0)


def test_no_segment_ids_means_one_document_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    model = LM(ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64))
    seen = _contexts(monkeypatch)
    model(torch.randint(0, 64, (3, 6)))
    assert seen[0].positions.tolist() == [list(range(6))] * 3
