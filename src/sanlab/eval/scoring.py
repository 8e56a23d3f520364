"""Log-likelihoods of many (context, continuation) token sequences, packed like training rows.

Each request is its own document: requests are packed into rows of `seq_len` tokens
with one segment id each, so attention never crosses a request and RoPE positions
restart at every request, exactly as for the packed training documents (`LM.forward`).
A request longer than `seq_len` is truncated from the left (the oldest context tokens
go), as lm-evaluation-harness does for its own models.

No lm-eval import here: the adapter (`sanlab.eval.adapter`) turns strings into ids and
calls `score`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class Scored:
    logprob: float  # sum of log p(continuation tokens | context), natural log
    greedy: bool  # every continuation token is the argmax of its distribution
    truncated: bool  # the context lost tokens on the left to fit seq_len


def _pack(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: indices of the requests in each row (each length <= row_len)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_len - lengths[i])
    return rows


@torch.no_grad()
def score(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    seq_len: int,
    batch_rows: int = 16,
    autocast_dtype: torch.dtype | None = None,
) -> list[Scored]:
    """(context ids, continuation ids) -> log p(continuation | context) for each request.

    The context must hold at least one token (the adapter starts every request with BOS).
    Continuations longer than `seq_len` keep their last `seq_len` tokens.
    """
    device = model.embed.weight.device
    inputs, n_cont, truncated = [], [], []
    for ctx, cont in requests:
        if not ctx:
            raise ValueError("a request needs at least one context token")
        full = list(ctx) + list(cont)
        window = full[-(seq_len + 1) :]  # input = window[:-1], targets = window[1:]
        inputs.append(window)
        n_cont.append(min(len(cont), len(window) - 1))
        truncated.append(len(full) > seq_len + 1)
    lengths = [len(w) - 1 for w in inputs]
    rows = _pack(lengths, seq_len)
    out: list[Scored | None] = [None] * len(requests)
    for b in range(0, len(rows), batch_rows):
        batch = rows[b : b + batch_rows]
        tokens = torch.zeros(len(batch), seq_len, dtype=torch.long)
        segments = torch.zeros(len(batch), seq_len, dtype=torch.long)
        spans: list[tuple[int, int, int, int]] = []  # (request, row, start, length)
        for r, members in enumerate(batch):
            pos = 0
            for seg, i in enumerate(members):
                n = lengths[i]
                tokens[r, pos : pos + n] = torch.tensor(inputs[i][:-1])
                segments[r, pos : pos + n] = seg
                spans.append((i, r, pos, n))
                pos += n
            segments[r, pos:] = len(members)  # padding: a document of its own, never read
        tokens, segments = tokens.to(device), segments.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            logits = model(tokens, segments)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        for i, r, pos, n in spans:
            k = n_cont[i]
            targets = torch.tensor(inputs[i][1:][n - k :], device=device)  # the continuation's tokens
            lp = logp[r, pos + n - k : pos + n]  # (k, V): predictions of those tokens
            ll = lp.gather(-1, targets[:, None]).sum().item()
            greedy = bool((lp.argmax(dim=-1) == targets).all().item())
            out[i] = Scored(ll, greedy, truncated[i])
    return [s for s in out if s is not None]
