"""Tests that catch planted bugs in the fused head + loss (`sanlab.model.loss`; each one a
mutant in scripts/mutate.py, named in its docstring): masks, frozen heads, autocast and the
log-sum-exp's guard."""

from __future__ import annotations

import pytest
import torch


# --------------------------------------------------------------------------- model/loss.py


def test_a_batch_without_loss_tokens_has_zero_loss_and_gradient() -> None:
    """loss-all-masked-nan: the fused head with an all-false mask gives 0, as lm_loss does."""
    from sanlab.model.loss import head_loss, lm_loss

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(17, 8, requires_grad=True)
    t = torch.randint(0, 17, (2, 3))
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, ce = head_loss(x, w, t, mask)
    assert loss.item() == 0.0 and ce.item() == 0.0
    assert lm_loss(x @ w.t(), t, mask)[0].item() == 0.0
    gx, gw = torch.autograd.grad(loss, (x, w))
    assert not gx.any() and not gw.any()


def test_the_fused_head_trains_hidden_states_with_the_head_frozen() -> None:
    """loss-frozen-head-no-grad: with the (tied) head frozen, dx still flows (a frozen embedding)."""
    from sanlab.model.loss import head_loss, lm_loss

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(17, 8, dtype=torch.float64)  # requires_grad False
    t = torch.randint(0, 17, (2, 3))
    mask = torch.ones(2, 3, dtype=torch.bool)
    (gx,) = torch.autograd.grad(head_loss(x, w, t, mask)[0], (x,))
    (ref,) = torch.autograd.grad(lm_loss(x @ w.t(), t, mask)[0], (x,))
    torch.testing.assert_close(gx, ref)


def test_under_autocast_the_fused_head_runs_in_the_autocast_dtype() -> None:
    """head-loss-autocast-ignored: under bf16 autocast the head is x.bf16 @ W.bf16ᵀ (as F.linear)."""
    from sanlab.model.loss import head_loss

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    w = torch.randn(33, 16)
    t = torch.randint(0, 33, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto, _ = head_loss(x, w, t, mask)
    bf16, _ = head_loss(x.bfloat16(), w, t, mask)
    fp32, _ = head_loss(x, w, t, mask)
    assert float(bf16) != float(fp32)
    assert torch.equal(auto, bf16)


def test_a_subnormal_target_probability_is_not_used_for_lse(monkeypatch: pytest.MonkeyPatch) -> None:
    """loss-tiny-threshold: p_t ≈ 3e-45 (2 fp32 subnormal steps) must not give lse = x_t − log p_t."""
    import sanlab.model.loss as kern

    monkeypatch.setattr(kern, "_compiled", lambda x, w: False)  # the torch rows: lse from the target
    w = torch.zeros(4, 1)
    w[1, 0] = 1.0  # logit of token 1 = x; every other logit 0
    x = torch.full((1, 1, 1), 102.5)
    t = torch.zeros(1, 1, dtype=torch.long)
    mask = torch.ones(1, 1, dtype=torch.bool)
    _, ce = kern.head_loss(x, w, t, mask, z_loss=0.0)
    want = torch.logsumexp(torch.tensor([0.0, 102.5, 0.0, 0.0], dtype=torch.float64), 0)
    assert float(ce) == pytest.approx(float(want), abs=1e-4)
