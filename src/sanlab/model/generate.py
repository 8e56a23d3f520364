"""Autoregressive decoding with a KV cache, for sampling and `generate_until`.

A decoder runs the model's own modules, one new token at a time: the embedding, then
every block through its own `forward` (norms, residual gates, sandwich norms, FFN
exactly as in training), the final norm and the tied head. Only each block's sequence
mixer is swapped, for the duration of a call, for its decode cache: the class the mixer
names as `decode_cache` (`sanlab.model.mixers.base.DecodeCache`; a subclass inherits its
parent's), which reads the mixer's own weights and keeps what the mixer needs of every
position seen so far (softmax attention: K and V), so a new token costs O(context)
instead of a forward pass over the whole context.

A model with a mixer that has no decode cache (`decode_cache = None`), or whose cache
declines its configuration (`DecodeCache.unsupported`), decodes by a full forward pass
over the context at every step (`Decoder.note` says so in one line), which gives the
same tokens, only slower.

The whole context is one document (segment 0), RoPE positions 0, 1, 2, … as in the
training rows' first document. When the context would outgrow the cache (the model's
`seq_len`), the oldest tokens are dropped and the window is prefilled again.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.errors import ConfigError
from sanlab.model.mixers.base import DecodeCache, DecodeStep, SequenceMixer


def uncached_reason(mixer: SequenceMixer) -> str | None:
    """Why `mixer` decodes without a cache (its name, or its cache's reason), None when it has one."""
    cache = type(mixer).decode_cache
    if cache is None:
        return type(mixer).spec.name or type(mixer).__name__
    return cache.unsupported(mixer)


def _block_mixers(block: nn.Module) -> list[tuple[str, SequenceMixer]]:
    """(attribute, module) of the sequence mixers directly inside a block."""
    return [(name, child) for name, child in block.named_children() if isinstance(child, SequenceMixer)]


# --------------------------------------------------------------------------- decoder


class Decoder:
    """Incremental forward passes of one LM over a growing context (batch `batch`).

    `prefill(tokens)` starts a context and `append(tokens)` extends it; both return the
    logits of the next token after the context (B, V) in fp32. With `use_cache=False`
    (or a mixer without a cached twin) every call is a full forward over the context.
    """

    def __init__(self, model: nn.Module, max_len: int, batch: int = 1, use_cache: bool = True) -> None:
        self.model = model
        self.max_len = max_len
        self.batch = batch
        mixers = [m for b in model.blocks for _, m in _block_mixers(b)]
        uncached = sorted({r for r in map(uncached_reason, mixers) if r is not None})
        self.cached = use_cache and bool(mixers) and not uncached
        self.note = None
        if use_cache and not self.cached:
            self.note = (f"no KV cache for sequence mixer {', '.join(uncached) or '?'}: "
                         "decoding with a full forward pass per token")
        self.context = torch.zeros(batch, 0, dtype=torch.long, device=self._device)
        self._caches: list[dict[str, DecodeCache]] = []

    @property
    def _device(self) -> torch.device:
        return self.model.embed.weight.device

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Start over with context `tokens` (B, T), at most max_len of them (the rightmost)."""
        tokens = tokens[:, -self.max_len :].to(self._device)
        self.context = tokens
        if not self.cached:
            return self._full_logits()
        self._caches = [
            {attr: type(m).decode_cache(m, tokens.shape[0], self.max_len) for attr, m in _block_mixers(b)}
            for b in self.model.blocks
        ]
        return self._run(tokens, start=0)

    @torch.no_grad()
    def append(self, tokens: torch.Tensor) -> torch.Tensor:
        """Extend the context by `tokens` (B, T). Past max_len the window slides: the
        oldest quarter is dropped and the rest prefilled again (cached or not, the same
        windows, so both paths give the same tokens)."""
        tokens = tokens.to(self._device)
        context = torch.cat([self.context, tokens], dim=1)
        if context.shape[1] > self.max_len:
            return self.prefill(context[:, -max(self.max_len - self.max_len // 4, tokens.shape[1]) :])
        start = self.context.shape[1]
        self.context = context
        return self._run(tokens, start=start) if self.cached else self._full_logits()

    def _full_logits(self) -> torch.Tensor:
        return self.model(self.context)[:, -1].float()

    def _run(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        m = self.model
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        ctx = DecodeStep(positions, m.cfg.rope_theta)
        x = m.embed(tokens) * m.embed_scale  # (B, T, d)
        for block, caches in zip(m.blocks, self._caches):
            with _swapped(block, caches):
                x = block(x, ctx)
        x = m.final_norm(x[:, -1:])
        return F.linear(x, m.embed.weight)[:, -1].float()  # tied head, (B, V)


@contextlib.contextmanager
def _swapped(block: nn.Module, replacements: dict[str, nn.Module]) -> Iterator[None]:
    """Replace a block's mixer modules for one call, then put the originals back."""
    originals = {attr: getattr(block, attr) for attr in replacements}
    try:
        for attr, mod in replacements.items():
            setattr(block, attr, mod)
        yield
    finally:
        for attr, mod in originals.items():
            setattr(block, attr, mod)


# --------------------------------------------------------------------------- sampling


# The most tokens one call generates. Not the model's context: past `seq_len` the window
# slides (`Decoder.append`), so a continuation may be longer than the rows the model was
# trained on; the bound only turns a mistyped count (1e9 tokens: days) into an error.
MAX_NEW_TOKENS = 1_000_000
SEED_RANGE = (0, 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy; top_k 0 and top_p 1 disable those filters."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"--max-new-tokens must lie in [0, {MAX_NEW_TOKENS:,}] (past the model's context the "
                              f"window slides, so the bound is a guard, not the context), got {self.max_new_tokens}")
        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ConfigError(f"--seed must lie in [0, 2^64 - 1], got {self.seed}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"--top-k must be non-negative, got {self.top_k}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"--top-p must lie in (0, 1], got {self.top_p}")


def pick(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V): greedy, or sampled after temperature,
    top-k and top-p (nucleus: the smallest set whose probability reaches top_p)."""
    if cfg.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / cfg.temperature
    if cfg.top_k:
        kth = logits.topk(min(cfg.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= cfg.top_p  # mass before this token already enough
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    cfg: SamplingConfig,
    *,
    max_len: int,
    stop_ids: tuple[int, ...] = (),
    use_cache: bool = True,
) -> Iterator[int]:
    """Yield new token ids one at a time after `prompt` (1-D ids), until `max_new_tokens`
    or a token in `stop_ids` (which is yielded)."""
    dec = Decoder(model, max_len=max_len, batch=1, use_cache=use_cache)
    gen = torch.Generator(device=dec._device).manual_seed(cfg.seed)
    logits = dec.prefill(prompt.view(1, -1))
    for _ in range(cfg.max_new_tokens):
        nxt = pick(logits, cfg, gen)
        tok = int(nxt.item())
        yield tok
        if tok in stop_ids:
            return
        logits = dec.append(nxt.view(1, 1))
