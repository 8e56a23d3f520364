"""Learning-rate schedules as pure functions of the step (SPEC §1.3).

Each function returns the multiplier of the peak learning rate for optimizer step
`step` (0-based: the multiplier used by the `step`-th update) out of `total` steps.
Being pure, the schedule needs no state in a checkpoint: a resumed run recomputes
exactly the same learning rate at every step.
"""

from __future__ import annotations

import math

from sanlab.config import OptimConfig


def _warmup(step: int, warmup_steps: int) -> float:
    """Linear warmup that reaches 1 at the end of the warmup and never starts at 0.

    The first update uses 1/warmup_steps of the peak rather than 0, so no step is wasted.
    """
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def _cosine(progress: float, final_frac: float) -> float:
    """Half-cosine from 1 (progress 0) down to `final_frac` (progress 1)."""
    progress = min(max(progress, 0.0), 1.0)
    return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))


def wsd(step: int, total: int, warmup_frac: float, decay_frac: float, final_lr_frac: float) -> float:
    """Warmup–stable–decay: linear warmup over the first `warmup_frac` of the steps,
    constant at the peak, then a cosine decay over the last `decay_frac` down to
    `final_lr_frac` of the peak, reached exactly at the last step."""
    warmup_steps = round(warmup_frac * total)
    decay_steps = round(decay_frac * total)
    decay_start = total - decay_steps
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    if decay_steps == 0 or step < decay_start:
        return 1.0
    # The first decay step is still (almost) at the peak; the last reaches final_lr_frac.
    progress = (step - decay_start + 1) / decay_steps
    return _cosine(progress, final_lr_frac)


def cosine(step: int, total: int, warmup_frac: float, final_lr_frac: float) -> float:
    """Linear warmup, then a cosine decay over all remaining steps to `final_lr_frac`."""
    warmup_steps = round(warmup_frac * total)
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    remaining = total - warmup_steps
    return _cosine((step - warmup_steps + 1) / remaining, final_lr_frac) if remaining else 1.0


def constant(step: int, total: int, warmup_frac: float) -> float:
    """Linear warmup, then the peak learning rate until the end."""
    return _warmup(step, round(warmup_frac * total))


def lr_multiplier(cfg: OptimConfig, step: int, total: int) -> float:
    """The multiplier of the configured schedule at `step` of `total`."""
    if cfg.schedule == "wsd":
        return wsd(step, total, cfg.warmup_frac, cfg.decay_frac, cfg.final_lr_frac)
    if cfg.schedule == "cosine":
        return cosine(step, total, cfg.warmup_frac, cfg.final_lr_frac)
    return constant(step, total, cfg.warmup_frac)
