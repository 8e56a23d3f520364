"""What the trainer does with the gradients of a step, observed at the optimizer step.

Two properties that the loss curves of the tiny configs cannot show:
- the trainer clips the global gradient norm to `optim.grad_clip` (its gradients must
  exceed the clip here, or the clip would be a no-op);
- the step's gradient is the gradient of the mean loss over *all* the step's unmasked
  tokens, so with micro-batches of very different token counts, accumulation gives the
  full batch's gradient (weighting each micro-batch by 1/n would not).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sanlab.config import load_config
from sanlab.data.loader import Loader
from sanlab.train.optim import Optimizers
from sanlab.train.trainer import train

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
        "model.vocab_size=320", "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=8",
        "train.log_every=1000", "train.precision=fp32", "train.device=cpu"]


def _grad_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """Record every parameter's gradient at each optimizer step (before the update)."""
    seen: list[dict[str, torch.Tensor]] = []
    real_step = Optimizers.step

    def step(self: Optimizers) -> None:
        grads = {}
        for opt, names in zip(self.optimizers, self.names):
            for group, group_names in zip(opt.param_groups, names):
                for name, p in zip(group_names, group["params"]):
                    if p.grad is not None:
                        grads[name] = p.grad.detach().clone()
        seen.append(grads)
        real_step(self)

    monkeypatch.setattr(Optimizers, "step", step)
    return seen


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))


def test_the_trainer_clips_the_gradient_norm(train_data_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clip = 0.05
    seen = _grad_spy(monkeypatch)
    cfg = load_config(None, [f"data.dir={train_data_dir}", *TINY, "train.steps=3", f"optim.grad_clip={clip}"])
    train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "grad_norm" in r]
    assert len(seen) == len(rows) == 3
    for row, grads in zip(rows, seen):
        assert row["grad_norm"] > 10 * clip  # the config's gradients do exceed the clip ...
        assert _norm(grads) == pytest.approx(clip, rel=1e-4)  # ... and the optimizer sees them clipped


def _uneven_token_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mask all but the first 2 targets of the first 2 rows of every training batch: with
    micro-batches of 2 rows, the first micro-batch has ~4 tokens and the others ~60 each."""
    real = Loader.batch

    def batch(self: Loader, step: int) -> dict[str, torch.Tensor]:
        b = real(self, step)
        if self.split == "train":
            b["loss_mask"][:2, 2:] = False
        return b

    monkeypatch.setattr(Loader, "batch", batch)


def test_accumulation_weights_micro_batches_by_token_count(train_data_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _uneven_token_counts(monkeypatch)
    seen = _grad_spy(monkeypatch)
    base = [f"data.dir={train_data_dir}", *TINY, "train.steps=1", "optim.grad_clip=0"]
    full = train(load_config(None, base), tmp_path / "full")
    accum = train(load_config(None, [*base, "train.micro_batch_rows=2"]), tmp_path / "accum")
    assert full["plan"]["accum"] == 1 and accum["plan"]["accum"] == 4
    g_full, g_accum = seen
    counts = Loader(train_data_dir, batch_rows=8).batch(0)["loss_mask"].view(4, -1).sum(1).tolist()
    assert counts[0] <= 4 and min(counts[1:]) >= 40  # the micro-batches differ a lot in token count
    assert g_full.keys() == g_accum.keys()
    for name in g_full:
        # fp32 accumulation differs from the full batch by ~1e-7 relative; weighting the
        # micro-batches 1/n instead of by token count moves these gradients by > 10%.
        torch.testing.assert_close(g_accum[name], g_full[name], rtol=1e-4, atol=1e-6, msg=name)
