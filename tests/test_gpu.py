"""CUDA paths: FlexAttention with a document block mask, bf16 autocast training, resume.

Skipped without a GPU (the default suite deselects `gpu`); run with `pytest -m gpu`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sanlab.config import ModelConfig, load_config
from sanlab.model.lm import LM, lm_loss

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _packed_batch(V: int, B: int = 2, T: int = 256):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, T), generator=g)
    cuts = torch.tensor([[0] * 100 + [1] * 120 + [2] * 36, [0] * 17 + [1] * 239])
    return tokens.cuda(), cuts.cuda()


@pytest.mark.parametrize("ffn", [False, True])
def test_flex_and_sdpa_agree_forward_and_backward(ffn):
    """The CUDA default (FlexAttention, block mask) computes what the SDPA dense-mask path does."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=ffn)
    flex = LM(cfg.model_copy(update={"attn_backend": "flex"})).cuda()
    sdpa = LM(cfg.model_copy(update={"attn_backend": "sdpa"})).cuda()
    sdpa.load_state_dict(flex.state_dict())
    tokens, seg = _packed_batch(512)
    targets, mask = tokens.roll(-1, 1), torch.ones_like(tokens, dtype=torch.bool)
    results = []
    for model in (flex, sdpa):
        logits = model(tokens, seg)
        lm_loss(logits, targets, mask)[0].backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2e-4, atol=2e-4)
    for name in results[0][1]:
        torch.testing.assert_close(results[0][1][name], results[1][1][name], rtol=2e-3, atol=2e-5, msg=name)


def test_cuda_matches_cpu_at_init():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=True)
    cpu = LM(cfg)
    gpu = LM(cfg).cuda()
    gpu.load_state_dict(cpu.state_dict())
    tokens, seg = _packed_batch(512)
    torch.testing.assert_close(gpu(tokens, seg).cpu(), cpu(tokens.cpu(), seg.cpu()), rtol=1e-3, atol=1e-3)


def test_training_on_cuda_learns_and_resumes(train_data_dir: Path, tmp_path: Path):
    """bf16 autocast on CUDA: the run completes, learns, and a resumed run finishes its steps."""
    from sanlab.train.trainer import train

    base = [f"data.dir={train_data_dir}", "data.seq_len=32", "model.vocab_size=320", "model.d_model=64",
            "model.n_layers=2", "train.batch_rows=16", "train.eval_every=20"]
    meta = train(load_config(None, base + ["train.steps=40"]), tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["device"]["type"] == "cuda" and meta["device"]["precision"] == "bf16"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 0.5
    # A longer run continued from the finished one's last checkpoint.
    meta2 = train(load_config(None, base + ["train.steps=60"]), tmp_path / "run", resume=True, force=True)
    assert meta2["status"] == "completed" and meta2["final"]["steps"] == 60
