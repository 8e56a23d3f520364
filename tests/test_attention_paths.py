"""Which attention kernel runs where, and every kernel against one mask definition.

- The dispatch rules (`sanlab.model.attention.dispatch`) as pure functions: FlexAttention
  only for rows of whole blocks on CUDA (short rows, odd lengths and decoding's growing
  context go to SDPA), called plainly inside a compiled model and compiled on its own
  only in an eager CUDA model; what a run's meta.json records.
- The masks built before the compiled region: a model compiled with `compile_layers`
  builds FlexAttention's block masks eagerly (never traced) and gives the eager logits.
- The family test: every backend that runs on the CPU (explicit, SDPA, the fused kernel
  where it builds, the pattern hook's path, FlexAttention's eager forward) on a model whose
  layers use different masks (whole document, window, sinks + window), every attention
  call against ONE reference dense mask (`definition`).
- The mask object: each mask's interval form (the fused kernel's) is its mask function
  where it has one; masks are equal and hashed by value, and the context's caches are
  keyed by them.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from sanlab.config import ModelConfig
from sanlab.model import native
from sanlab.model.attention import DOCUMENT, Window, attention_kernel, attention_reference, masks, resolve_backend
from sanlab.model.attention import context as context_module
from sanlab.model.attention.dispatch import FLEX_BLOCK, flex_call, flex_fits
from sanlab.model.hooks import capture
from sanlab.model.lm import LM
from sanlab.model.mixers import non_approximate, softmax
from sanlab.model.mixers.sink_window import SinksAndWindow

# FlexAttention's eager CPU forward (the reference path here) warns that it is unfused
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

W = 3  # the window of the model's sliding-window and sinks + window layers
S = 2  # the sinks of its sinks + window layers


def tiny(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=64)
    return ModelConfig(**(base | kw))


def definition(seg: torch.Tensor, window: int | None, sinks: int = 0) -> torch.Tensor:
    """(B, 1, T, T): query i sees key j when they share a document, j ≤ i and i − j < window
    (SPEC: causal, document-masked, sliding window of `window` keys, itself included), or
    j is one of its document's first `sinks` tokens."""
    B, T = seg.shape
    allowed = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b, i, j in itertools.product(range(B), range(T), range(T)):
        start = next(s for s in range(j + 1) if bool((seg[b, s:j + 1] == seg[b, j]).all()))  # j's document start
        allowed[b, 0, i, j] = (bool(seg[b, i] == seg[b, j]) and j <= i
                               and (window is None or i - j < window or j - start < sinks))
    return allowed


def defined(mask: masks.Mask) -> tuple[int | None, int]:
    """The (window, sinks) of `definition` a mask stands for, read from its fields."""
    return getattr(mask, "window", None), getattr(mask, "sinks", 0)


def on_cuda(T: int) -> SimpleNamespace:
    """A stand-in for a (2, T) token batch on a CUDA device (the rules read its shape and device)."""
    return SimpleNamespace(shape=(2, T), device=torch.device("cuda"))


# --------------------------------------------------------------------------- the dispatch rules


def test_flex_takes_rows_of_whole_blocks_only():
    assert FLEX_BLOCK == 128
    assert [T for T in (1, 4, 37, 127, 128, 129, 200, 255, 256, 384, 2048, 2049) if flex_fits(T)] == [128, 256, 384,
                                                                                                      2048]


@pytest.mark.parametrize("requested", ["auto", "flex"])
def test_on_cuda_rows_flex_cannot_take_run_on_sdpa(requested):
    """auto and flex on CUDA: FlexAttention for rows of whole blocks; SDPA (same document mask)
    for short rows (a 4- and a 1-token row crashed inductor on an H200), odd lengths and the
    lengths decoding without a cache runs at."""
    cfg = tiny(attn_backend=requested)
    for T, kernel in [(2048, "flex"), (256, "flex"), (128, "flex"), (1, "sdpa"), (4, "sdpa"), (127, "sdpa"),
                      (130, "sdpa"), (2047, "sdpa")]:
        assert resolve_backend(cfg, on_cuda(T)) == kernel, T
        assert attention_kernel(cfg, torch.device("cuda"), "bf16", T) == kernel, T
    assert attention_kernel(cfg, torch.device("cuda"), "bf16") == "sdpa"  # (no row length: the safe one)
    for other in ("sdpa", "explicit"):
        assert resolve_backend(tiny(attn_backend=other), on_cuda(64)) == other
        assert attention_kernel(tiny(attn_backend=other), torch.device("cuda"), "bf16", 2048) == other


def test_on_the_cpu_the_row_length_changes_nothing_recorded():
    cpu = torch.device("cpu")
    for requested in ("auto", "explicit", "sdpa", "flex"):
        cfg = tiny(attn_backend=requested)
        assert attention_kernel(cfg, cpu, "fp32", 2048) == attention_kernel(cfg, cpu, "fp32")
    assert resolve_backend(tiny(attn_backend="flex"), torch.zeros(2, 256, dtype=torch.long)) == "sdpa"


def test_flex_is_called_plainly_inside_a_compiled_model():
    """Inside a compiled model flex is traced with it (a separately compiled flex nested in a
    compiled model crashed on an H200); in an eager CUDA model it is compiled on its own
    (uncompiled it materialises the score matrix); on the CPU, plain (forward only)."""
    assert flex_call("cuda", compiling=True) == "plain"
    assert flex_call("cuda", compiling=False) == "compiled"
    assert flex_call("cpu", compiling=False) == "plain"
    assert flex_call("cpu", compiling=True) == "plain"


# --------------------------------------------------------------------------- FlexAttention's mask


@pytest.mark.parametrize("window,sinks", [(None, 0), (1, 0), (2, 0), (W, 0), (7, 0), (40, 0), (W, S), (1, 1), (2, 5)])
def test_flex_mask_function_is_the_definition(window, sinks):
    """FlexAttention's mask function (the CUDA default's), materialised over every (b, q, k),
    is the definition: with a window, exactly `window` keys per row at most, plus the
    document's first `sinks`."""
    seg = torch.tensor([[0] * 4 + [1] * 9 + [2] * 3, [0] * 16])
    B, T = seg.shape
    mask = SinksAndWindow(sinks, window) if sinks else masks.window(window)
    mod = masks.mask_mod(seg, mask)
    b, q, k = torch.arange(B)[:, None, None], torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    dense = mod(b, None, q, k)[:, None]
    assert torch.equal(dense, definition(seg, window, sinks))
    assert torch.equal(masks.dense_mask(seg, mask), definition(seg, window, sinks))


@pytest.mark.parametrize("mask", [DOCUMENT, Window(1), Window(W), Window(40), SinksAndWindow(0, W),
                                  SinksAndWindow(S, W), SinksAndWindow(1, 1), SinksAndWindow(5, 40)])
def test_a_masks_interval_form_is_its_mask_function(mask):
    """Where a mask has an interval form (`Mask.first_key`, what the fused kernel takes),
    row i's allowed keys are exactly [first key, i]; where it has none (sinks before a
    window that has moved past them) `first_keys` is None and the fused kernel does not
    run. The decode cache's mask is the mask function on one document."""
    seg = torch.tensor([[0] * 4 + [1] * 9 + [2] * 3, [0] * 16])
    pos = masks.segment_positions(seg)
    allowed = masks.dense_mask(seg, mask)[:, 0]
    first = masks.row_starts(seg, pos, False, mask)
    T = seg.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    intervals = (first.long()[:, :, None] <= j) & (j <= i) if first is not None else None
    assert (first is None) == (isinstance(mask, SinksAndWindow) and mask.sinks > 0)
    if mask == SinksAndWindow(S, W):  # (and it has none: row 8 of the 9-token document sees keys 4, 5 and 10-12)
        assert allowed[0, 12].nonzero().flatten().tolist() == [4, 5, 10, 11, 12]
    if intervals is not None:
        assert first.dtype == torch.int32
        assert torch.equal(intervals, allowed)
    decode = masks.decode_mask(mask, torch.arange(5, 16), 16)  # the last 11 of a 16-token document
    assert torch.equal(decode, masks.dense_mask(seg[1:], mask)[0, 0, 5:])


def test_masks_are_keyed_by_value():
    """Masks are equal and hashed by their class and parameters, so the context builds one
    form per distinct mask, whichever layer asks; a window is a positive int."""
    assert Window(3) == Window(3) and hash(Window(3)) == hash(Window(3))
    assert len({Window(3), Window(3), Window(4), DOCUMENT, masks.window(None), SinksAndWindow(0, 3),
                SinksAndWindow(2, 3), SinksAndWindow(2, 3)}) == 5
    assert masks.window(None) is DOCUMENT and masks.window(5) == Window(5)
    seg = torch.tensor([[0] * 4 + [1] * 9])
    ctx = context_module.build_context(tiny(attn_backend="explicit"), seg, seg)
    assert ctx.allowed(Window(3)) is ctx.allowed(Window(3))
    assert not torch.equal(ctx.allowed(Window(3)), ctx.allowed(SinksAndWindow(2, 3)))
    assert ctx.additive_mask(torch.float32, Window(3)) is not ctx.additive_mask(torch.float32, SinksAndWindow(2, 3))
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="attention window"):
            masks.window(bad)


# --------------------------------------------------------------------------- masks outside the compiled region


def test_a_compiled_model_builds_its_block_masks_before_the_graph(monkeypatch):
    """With FlexAttention (forced: on the CPU it runs its eager forward), a model compiled by
    `compile_layers` builds one block mask per window its layers use, once per batch and
    outside the compiled region (`torch.compiler.is_compiling()` false), and gives the
    eager model's logits, staying compiled."""
    torch.manual_seed(0)
    model = LM(tiny(mixer="sliding_window", layout="hybrid", mixer_options={"window": W}))
    tokens, seg = torch.randint(0, 64, (2, 24)), torch.tensor([[0] * 5 + [1] * 19, [0] * 24])
    with torch.no_grad():
        eager = model(tokens, seg)
    built = []
    block_mask = masks.block_mask
    monkeypatch.setattr(masks, "block_mask",
                        lambda s, mask=DOCUMENT, pos=None: built.append((mask, torch.compiler.is_compiling())) or
                        block_mask(s, mask, pos))
    monkeypatch.setattr(context_module, "resolve_backend", lambda cfg, t: "flex")
    torch._dynamo.reset()
    model.compile_layers(backend="eager")  # dynamo's tracing, without inductor's minutes on 2 cores
    with torch.no_grad():
        compiled = model(tokens, seg)
    assert model.compiled
    assert sorted(built, key=str) == [(DOCUMENT, False), (Window(3), False)]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_every_attending_mixer_announces_its_masks(monkeypatch):
    """Every registered sequence mixer asks `attend` only for masks it announced
    (`SequenceMixer.attention_masks`), so the model builds them all before its compiled layers."""
    from sanlab.model.mixers import MIXERS

    asked: dict[str, set] = {}
    flex_block_mask = context_module.AttentionContext.flex_block_mask

    def spy(self, mask=DOCUMENT):
        asked.setdefault(current, set()).add(mask)
        return flex_block_mask(self, mask)

    monkeypatch.setattr(context_module.AttentionContext, "flex_block_mask", spy)
    monkeypatch.setattr(context_module, "resolve_backend", lambda cfg, t: "flex")
    tokens = torch.randint(0, 64, (1, 12))
    for name in MIXERS:
        current = name
        options = {"sliding_window": {"window": W}, "sink_window": {"sinks": S, "window": W}}.get(name, {})
        model = LM(tiny(n_layers=2, mixer=name, mixer_options=options))
        model.bind_data(lambda n: torch.arange(n) % 64, 12)
        announced = set(model._masks)
        asked.pop(name, None)
        with torch.no_grad():
            model(tokens)
        # every mask asked for was built by `build_context` from the announced windows
        assert asked.get(name, set()) <= announced, name
    assert asked["sliding_window"] == {Window(W)} and asked["softmax"] == {DOCUMENT}
    assert asked["sink_window"] == {SinksAndWindow(S, W)}


# --------------------------------------------------------------------------- the family test


def _backends() -> list[str]:
    found = ["explicit", "sdpa", "pattern", "flex"]
    return found + (["fused"] if native.available() else [])


LAYOUTS = {  # model.mixer, its options, the layout
    "hybrid": ("sliding_window", {"window": W}, "hybrid"),
    "windows": ("sliding_window", {"window": W}, ["sliding_window", "softmax", "non_approximate", "sliding_window"]),
    "sinks": ("sink_window", {"sinks": S, "window": W}, ["sink_window", "sliding_window", "non_approximate", "softmax"]),
}


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_backend_attends_under_the_one_reference_mask(backend, layout, monkeypatch):
    """Every `attend` call of a model whose layers use different masks (whole document,
    window W, sinks S + window W, a window of the default 128; softmax, sliding_window,
    sink_window, non_approximate) gives `attention_reference` under the definition's mask
    for its layer, on packed documents with GQA; on the fused kernel (whose softmax layers
    bypass `attend`; sinks + window has no interval form and falls back) the logits equal
    the explicit kernel's, and under pattern capture every layer's pattern is nonzero
    exactly where its mask allows. The explicit kernel's masks are cached per mask: a
    cache keyed by dtype alone gives every layer the first layer's mask."""
    torch.manual_seed(0)
    mixer, options, mixers = LAYOUTS[layout]
    cfg = tiny(mixer=mixer, layout=mixers, mixer_options=options,
               attn_backend="explicit" if backend in ("pattern", "flex") else backend)
    model = LM(cfg)
    tokens = torch.randint(0, 64, (2, 19))
    seg = torch.tensor([[0] * 6 + [1] * 13, [0] * 2 + [1] * 3 + [2] * 14])
    own = {"sliding_window": (options.get("window", 128) if mixer == "sliding_window" else 128, 0),
           "sink_window": (W, S)}  # (window, sinks) of each layer, from the config
    layers = {i: own.get(m, (None, 0)) for i, m in enumerate(cfg.layer_mixers)}
    reference = {ws: definition(seg, *ws) for ws in set(layers.values())}
    seen = []

    def checked(real):
        def attend(q, k, v, ctx, hook=None, *, mask=DOCUMENT):
            out = real(q, k, v, ctx, hook, mask=mask)
            want = attention_reference(q, k, v, reference[defined(mask)])
            torch.testing.assert_close(out.float(), want, rtol=1e-4, atol=1e-5)
            seen.append(defined(mask))
            return out
        return attend

    for module in (softmax, non_approximate):
        monkeypatch.setattr(module, "attend", checked(module.attend))
    if backend == "flex":  # FlexAttention's eager forward (no CPU backward in this torch)
        monkeypatch.setattr(context_module, "resolve_backend", lambda cfg, t: "flex")
    with torch.no_grad():
        if backend == "pattern":
            with capture(model, ["blocks.*.attn.pattern"]) as got:
                logits = model(tokens, seg)
            for i, ws in layers.items():
                A = got[f"blocks.{i}.attn.pattern"]
                assert torch.equal(A > 0, reference[ws].expand_as(A)), (i, ws)
        else:
            logits = model(tokens, seg)
    ran = list(seen)
    if backend == "fused":
        explicit = LM(cfg.model_copy(update={"attn_backend": "explicit"}))
        explicit.load_state_dict(model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(logits, explicit(tokens, seg), rtol=1e-4, atol=1e-4)
        # the masked layers attend through `attend` on the fused kernel too
        want = [ws for i, ws in layers.items() if cfg.layer_mixers[i] != "softmax"]
        assert sorted(ran, key=str) == sorted(want, key=str)
    else:
        assert sorted(ran, key=str) == sorted(layers.values(), key=str)
