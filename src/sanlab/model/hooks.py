"""Capture named intermediate tensors without touching training code.

    with capture(model, ["blocks.*.attn.pattern", "blocks.3.resid_post"]) as acts:
        model(tokens, segment_ids)
    acts["blocks.3.attn.pattern"]  # (B, H, T, T)

Names are the module paths of `HookPoint`s (see `hook_names`); `*` matches one
path component and `fnmatch` wildcards are accepted. Captured tensors are detached.
Attention patterns are only materialised while someone captures them.
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from torch import nn

from sanlab.model.layers import HookPoint


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point's stable name, in forward order."""
    return [name for name, m in model.named_modules() if isinstance(m, HookPoint)]


@contextmanager
def capture(
    model: nn.Module, names: Sequence[str], *, to_cpu: bool = False, dtype: torch.dtype | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    available = {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
    chosen = [n for n in available if any(fnmatch.fnmatchcase(n, pat) for pat in names)]
    if not chosen:
        raise KeyError(f"no hook point matches {list(names)}; known: {', '.join(available)}")
    acts: dict[str, torch.Tensor] = {}
    handles = []
    for name in chosen:

        def hook(_module: nn.Module, _inp: tuple, out: torch.Tensor, name: str = name) -> None:
            t = out.detach()
            if dtype is not None:
                t = t.to(dtype)
            acts[name] = t.cpu() if to_cpu else t

        handles.append(available[name].register_forward_hook(hook))
    try:
        yield acts
    finally:
        for h in handles:
            h.remove()
