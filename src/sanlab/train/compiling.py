"""`train.compile`: whether a run compiles its model (`sanlab.train.resolve.resolve_compile`), and compiling it
so that a compiler failure never stops a run (`compile_for_training`).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from sanlab.errors import SanlabError
from sanlab.model.lm import LM


def compile_for_training(model: LM, on: bool, probe: Callable[[], None], say: Callable[[str], None]) -> bool:
    """With `on`, compile `model`'s layers (`LM.compile_layers`) and run `probe` (one
    forward and backward at the training batch's shape) so the compile happens now and
    its time is said; a compiler failure then or later leaves the model eager, with one
    line of warning to `say`. The probe's gradients are dropped, so the run is unchanged.
    Returns whether the model runs compiled."""
    if not on:
        return False
    start = time.perf_counter()
    try:
        model.compile_layers(say)
        probe()
    except (SanlabError, torch.OutOfMemoryError):
        raise  # not the compiler's: the eager model would fail the same way
    except Exception as e:  # noqa: BLE001 - a backward the compiler cannot build: train eagerly
        model.fall_back_to_eager(e)
    model.zero_grad(set_to_none=True)
    if model.compiled:
        say(f"torch.compile: compiled in {time.perf_counter() - start:.1f} s")
    return model.compiled
