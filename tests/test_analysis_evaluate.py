"""The evaluation pass: losses pair with the token table, collectors see every layer."""

from __future__ import annotations

import pytest
import torch

from sanlab.analysis import metrics as M
from sanlab.analysis.evaluate import EvalSample, evaluate
from sanlab.analysis.stream import gate_values
from sanlab.config import ModelConfig
from sanlab.model.hooks import capture
from sanlab.model.lm import LM, lm_loss

CFG = ModelConfig(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64)


def _sample(rows: int = 5, t: int = 12) -> EvalSample:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(8, 64, (rows, t + 1), generator=g)
    seg = torch.zeros(rows, t, dtype=torch.long)
    seg[:, 7:] = 1  # two documents per row
    mask = torch.ones(rows, t, dtype=torch.bool)
    mask[:, 6] = False  # the step from one document into the next
    return EvalSample(
        inputs=tokens[:, :-1],
        targets=tokens[:, 1:],
        segment_ids=seg,
        region_ids=torch.randint(0, 4, (rows, t), generator=g),
        loss_mask=mask,
        exercise=(seg + torch.arange(rows)[:, None]) % 2,
        exercise_names=("math", "rag"),
    )


def test_losses_match_lm_loss_and_token_table() -> None:
    torch.manual_seed(0)
    model = LM(CFG)
    s = _sample()
    res = evaluate(model, s, batch_rows=2)
    table = s.token_table()
    assert res.losses.shape == (int(s.loss_mask.sum()),) == (len(table),)
    with torch.no_grad():
        _, ce = lm_loss(model(s.inputs, s.segment_ids), s.targets, s.loss_mask)
    assert float(res.losses.mean()) == pytest.approx(float(ce), rel=1e-5)
    assert table.position.max() == 5 and table.position.min() == 0


def test_attention_rows_match_direct_capture() -> None:
    torch.manual_seed(0)
    model = LM(CFG)
    s = _sample()
    res = evaluate(model, s, batch_rows=2)
    assert res.attention is not None and res.stream is not None
    assert len(res.attention["heads"]) == CFG.n_layers * CFG.n_heads
    assert len(res.attention["layers"]) == CFG.n_layers
    with capture(model, ["blocks.1.attn.pattern"]) as acts:
        model(s.inputs, s.segment_ids)
    direct = M.attention_metrics(acts["blocks.1.attn.pattern"], s.segment_ids)
    rows = [r for r in res.attention["heads"] if r["layer"] == 1]
    assert [r["entropy"] for r in rows] == pytest.approx(direct["entropy"].tolist(), rel=1e-5)
    assert [r["sink"] for r in rows] == pytest.approx(direct["sink"].tolist(), rel=1e-5)
    norm = evaluate(model, s, normalize_attention=True, stream=False).attention
    assert norm is not None and min(r["entropy"] for r in norm["heads"]) == 0.0
    assert max(r["entropy"] for r in norm["heads"]) == 1.0


def test_stream_rows_and_gates() -> None:
    torch.manual_seed(0)
    model = LM(CFG)
    res = evaluate(model, _sample(), attention=False)
    assert res.attention is None and res.stream is not None
    assert [r["hook"] for r in res.stream] == ["blocks.0.resid_pre"] + [f"blocks.{i}.resid_post" for i in range(3)]
    for r in res.stream:
        assert 0 < r["rms"] <= r["max_abs"]
        assert 1.0 <= r["rep_rank"] <= CFG.d_model
    gates = gate_values(model.state_dict(), CFG)
    assert [g["attn"] for g in gates] == [0.5] * 3 and all(g["ffn"] is None for g in gates)
    rez = CFG.model_copy(update={"residual": "rezero", "ffn": True})
    assert gate_values(LM(rez).state_dict(), rez)[0] == {"layer": 0, "attn": 0.0, "ffn": 0.0}
