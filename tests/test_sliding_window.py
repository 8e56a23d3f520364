"""The sliding-window mixer (src/sanlab/model/mixers/sliding_window.py), docs/variants.md's worked
example of a variant: its test. (The registry tests of tests/test_variants.py check the
rest for it, as for every registered mixer: accounting, FLOPs, causality, packed rows,
the pattern hook, init, analysis.)"""

from __future__ import annotations

import pytest
import torch

from sanlab.accounting import measure_forward_flops
from sanlab.config import ModelConfig
from sanlab.model import native
from sanlab.model.hooks import capture
from sanlab.model.lm import LM


@pytest.mark.skipif(not native.available(), reason=f"compiled kernels: {native.unavailable_reason()}")
def test_sliding_window_on_the_fused_kernel_equals_the_explicit_kernel():
    """On packed documents (one shorter than the window, the others longer), the model on
    the fused kernel gives the explicit kernel's logits, loss and every gradient (to fp32
    rounding), and a token's attention is spread over exactly the keys of its document
    with 0 ≤ i − j < window."""
    W, T = 5, 24
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96,
                      mixer="sliding_window", mixer_options={"window": W})
    torch.manual_seed(0)
    tokens = torch.randint(0, 96, (2, T))
    seg = torch.tensor([[0] * 3 + [1] * 21, [0] * 13 + [1] * 11])
    models = {b: LM(cfg.model_copy(update={"attn_backend": b})) for b in ("fused", "explicit")}
    models["explicit"].load_state_dict(models["fused"].state_dict())
    assert "sanlab.fused_attention" in measure_forward_flops(models["fused"], tokens, seg).by_op  # (no fallback)

    results = {}
    for backend, model in models.items():
        loss, _ = model(tokens, seg, tokens.roll(-1, 1), torch.ones_like(tokens, dtype=torch.bool), 1e-4)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for _, p in sorted(model.named_parameters())])
        results[backend] = (model(tokens, seg).detach(), loss.detach(), grads)
    (logits, loss, grads), (logits_ref, loss_ref, grads_ref) = results["fused"], results["explicit"]
    torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=1e-6)
    assert float((grads - grads_ref).norm() / grads_ref.norm()) < 1e-5

    with capture(models["fused"], ["blocks.*.attn.pattern"]) as got:
        models["fused"](tokens, seg)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (seg[:, :, None] == seg[:, None, :]) & (0 <= i - j) & (i - j < W)  # (B, T, T)
    for A in got.values():  # (B, H, T, T)
        assert torch.equal(A > 0, allowed[:, None].expand_as(A))
        torch.testing.assert_close(A.sum(-1), torch.ones(A.shape[:-1]))
