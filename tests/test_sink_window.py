"""The sinks + window mixer (src/sanlab/model/mixers/sink_window.py), docs/variants.md's second
worked example, a variant with a mask of its own: its test. (The registry tests of
tests/test_variants.py and tests/test_generate.py check the rest for it, as for every
registered mixer; tests/test_attention_paths.py runs its layers next to others on every
backend.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from sanlab.config import ModelConfig
from sanlab.model import native
from sanlab.model.attention import attend, attention_reference, build_context
from sanlab.model.generate import Decoder
from sanlab.model.hooks import capture
from sanlab.model.layers import HookPoint
from sanlab.model.lm import LM
from sanlab.model.mixers.sink_window import SinksAndWindow

# FlexAttention's eager CPU forward (one of the backends here) warns that it is unfused
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

S, W = 2, 3
SEG = torch.tensor([[0] * 3 + [1] * 12 + [2] * 5, [0] * 20])  # documents shorter and longer than S + W


def definition(seg: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """(B, 1, T, T): query i sees key j when they share a document, j ≤ i, and j is one of
    its document's first `sinks` tokens or i − j < window."""
    B, T = seg.shape
    allowed = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b, i, j in itertools.product(range(B), range(T), range(T)):
        start = min(s for s in range(T) if bool(seg[b, s] == seg[b, j]))  # (each document is one run)
        allowed[b, 0, i, j] = bool(seg[b, i] == seg[b, j]) and j <= i and (j - start < sinks or i - j < window)
    return allowed


def tiny(backend: str = "auto", **options: int) -> ModelConfig:
    return ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, mixer="sink_window",
                       mixer_options={"sinks": S, "window": W} | options, attn_backend=backend)


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "pattern", "flex", "fused"])
def test_attention_is_the_definition_on_every_backend(backend):
    """`attend` under the mixer's mask equals softmax(q kᵀ/√D) v over the definition's keys
    (output, and gradients where the backend has a backward) on packed documents with GQA,
    on every backend the CPU has: the explicit kernel, SDPA, the pattern hook's path (its
    pattern nonzero exactly there), FlexAttention's eager forward, and the fused backend,
    where the mask has no interval form and runs on its fallback."""
    if backend == "fused" and not native.available():
        pytest.skip(f"compiled kernels: {native.unavailable_reason()}")
    torch.manual_seed(0)
    B, H, Hkv, D = 2, 4, 2, 8
    T = SEG.shape[1]
    mask = SinksAndWindow(S, W)
    ctx = build_context(tiny("explicit" if backend in ("pattern", "flex") else backend), SEG, SEG)
    if backend == "flex":
        ctx.backend = "flex"
    hook, seen = None, []
    if backend == "pattern":
        hook = HookPoint()
        hook.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    # (FlexAttention has no CPU backward in this torch: its forward only)
    leaves = [torch.randn(B, h, T, D, requires_grad=backend != "flex") for h in (H, Hkv, Hkv)]
    allowed = definition(SEG, S, W)
    if backend == "fused":
        assert ctx.first_keys(mask) is None  # (the fallback, not the fused kernel)
    out = attend(*leaves, ctx, hook, mask=mask)
    ref_leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    ref = attention_reference(*ref_leaves, allowed)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if backend != "flex":
        dout = torch.randn(B, H, T, D)
        for g, r in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(ref, ref_leaves, dout)):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    if backend == "pattern":
        assert torch.equal(seen[0] > 0, allowed.expand(B, H, T, T))


@pytest.mark.parametrize("sinks", [0, S])
def test_the_model_attends_under_its_options(sinks):
    """The mixer's options are its mask: every layer's pattern is nonzero exactly where the
    definition allows and its rows sum to 1; on the fused backend (the fused kernel itself
    when sinks = 0, the one case with an interval form; the fallback otherwise) the logits
    are the explicit kernel's."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, SEG.shape)
    models = {b: LM(tiny(b, sinks=sinks)) for b in ("explicit", "fused")}
    models["fused"].load_state_dict(models["explicit"].state_dict())
    with torch.no_grad(), capture(models["explicit"], ["blocks.*.attn.pattern"]) as got:
        models["explicit"](tokens, SEG)
    allowed = definition(SEG, sinks, W)
    for A in got.values():
        assert torch.equal(A > 0, allowed.expand_as(A))
        torch.testing.assert_close(A.sum(-1), torch.ones(A.shape[:-1]))
    if native.available():
        with torch.no_grad():
            torch.testing.assert_close(models["fused"](tokens, SEG), models["explicit"](tokens, SEG),
                                       rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_the_full_forward():
    """Decoding goes through softmax attention's KV cache (no copy of it), which applies the
    mask: every step's logits are a full forward pass's over the context, past the point
    (S + W tokens) where the sinks and the window are two intervals, with a multi-token
    prefill and a context that slides past the cache's length."""
    torch.manual_seed(0)
    model = LM(tiny())
    model.eval()
    dec = Decoder(model, max_len=16)
    assert dec.cached and dec.note is None
    context = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    logits = dec.prefill(context)
    for _ in range(14):
        with torch.no_grad():
            full = model(dec.context)[:, -1]
        torch.testing.assert_close(logits, full, rtol=2e-5, atol=2e-5)
        nxt = logits.argmax(-1, keepdim=True)
        logits = dec.append(nxt)
    assert dec.context.shape[1] < 20  # (the context slid: the oldest tokens were dropped)
