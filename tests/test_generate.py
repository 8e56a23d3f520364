"""KV-cache decoding against full forward passes, and the samplers' filters."""

from __future__ import annotations

import itertools

import pytest
import torch

from sanlab.config import ModelConfig
from sanlab.model import generate as gen
from sanlab.model import mixers
from sanlab.model.generate import Decoder, SamplingConfig, generate, pick
from sanlab.model.lm import LM
from sanlab.model.mixers.softmax import SoftmaxAttention, SoftmaxSpec
from sanlab.model.mixers.static_emb_qk import StaticEmbQK, StaticEmbQKSpec


def tiny(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, init_std=0.2)
    base.update(kw)
    return ModelConfig(**base)


def trained_looking(cfg: ModelConfig, seed: int = 0) -> LM:
    """A model with gates and gains moved off their init (so every switch matters)."""
    torch.manual_seed(seed)
    model = LM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim < 2:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    return model


def greedy_against_full_forward(model: LM, prompt: torch.Tensor, steps: int, max_len: int) -> None:
    """Greedy decoding with the cache; at every step the cached logits equal a full
    forward pass over the whole context and the chosen token is that pass's argmax."""
    dec = Decoder(model, max_len=max_len)
    assert dec.cached and dec.note is None
    logits = dec.prefill(prompt[None])
    context = prompt.clone()
    for _ in range(steps):
        full = model(context[None])[0, -1]
        torch.testing.assert_close(logits[0], full, atol=2e-5, rtol=2e-5)
        nxt = logits[0].argmax()
        assert nxt == full.argmax()
        context = torch.cat([context, nxt[None]])
        logits = dec.append(nxt.view(1, 1))


SWITCHES = list(itertools.product([False, True], ["gated", "rezero", "standard", "none"]))


@pytest.mark.parametrize("ffn,residual", SWITCHES)
def test_cached_greedy_equals_full_forward_argmax(ffn, residual):
    model = trained_looking(tiny(ffn=ffn, residual=residual))
    prompt = torch.randint(0, 64, (7,), generator=torch.Generator().manual_seed(1))
    greedy_against_full_forward(model, prompt, steps=12, max_len=32)


@pytest.mark.parametrize("norm,qk_norm,sandwich", [("rms", True, False), ("zcrms", False, False), ("zcrms", True, True)])
def test_cached_greedy_norm_switches(norm, qk_norm, sandwich):
    for ffn in (False, True):
        model = trained_looking(tiny(ffn=ffn, norm=norm, qk_norm=qk_norm, sandwich_norm=sandwich, n_kv_heads=4))
        prompt = torch.randint(0, 64, (5,), generator=torch.Generator().manual_seed(2))
        greedy_against_full_forward(model, prompt, steps=8, max_len=16)


def test_batch_and_multi_token_append_match_full_forward():
    model = trained_looking(tiny(ffn=True))
    tokens = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(3))
    dec = Decoder(model, max_len=32, batch=3)
    dec.prefill(tokens[:, :6])
    dec.append(tokens[:, 6:11])
    last = dec.append(tokens[:, 11:20])
    torch.testing.assert_close(last, model(tokens)[:, -1], atol=2e-5, rtol=2e-5)


def test_cache_and_no_cache_give_the_same_tokens_past_the_window():
    """Past max_len the window slides the same way with and without the cache."""
    model = trained_looking(tiny(ffn=False))
    prompt = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(4))
    cfg = SamplingConfig(max_new_tokens=30, temperature=0)
    cached = list(generate(model, prompt, cfg, max_len=16))
    full = list(generate(model, prompt, cfg, max_len=16, use_cache=False))
    assert cached == full and len(cached) == 30


def test_sampling_is_seeded_and_same_with_or_without_cache():
    model = trained_looking(tiny(ffn=True))
    prompt = torch.randint(0, 64, (4,), generator=torch.Generator().manual_seed(5))
    cfg = SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    a = list(generate(model, prompt, cfg, max_len=32))
    assert a == list(generate(model, prompt, cfg, max_len=32))
    assert a == list(generate(model, prompt, cfg, max_len=32, use_cache=False))


def test_stop_token_ends_generation():
    model = trained_looking(tiny())
    prompt = torch.tensor([1, 2, 3])
    first = next(iter(generate(model, prompt, SamplingConfig(max_new_tokens=5, temperature=0), max_len=32)))
    out = list(generate(model, prompt, SamplingConfig(max_new_tokens=5, temperature=0), max_len=32, stop_ids=(first,)))
    assert out == [first]


def test_a_mixer_without_a_cache_falls_back_to_full_forward(monkeypatch):
    model = trained_looking(tiny())
    monkeypatch.setattr(SoftmaxAttention, "decode_cache", None)
    dec = Decoder(model, max_len=16)
    assert not dec.cached and "softmax" in dec.note
    prompt = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(dec.prefill(prompt), model(prompt)[:, -1])


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(pick(logits, SamplingConfig(top_k=2), g)) for _ in range(200)}
    assert draws == {0, 1}
    # top_p=0.75: 0.5 < 0.75, 0.5 + 0.3 >= 0.75, so tokens 0 and 1 survive
    draws = {int(pick(logits, SamplingConfig(top_p=0.75), g)) for _ in range(200)}
    assert draws == {0, 1}
    draws = {int(pick(logits, SamplingConfig(top_p=0.4), g)) for _ in range(50)}
    assert draws == {0}
    assert int(pick(logits, SamplingConfig(temperature=0), g)) == 0


@pytest.mark.parametrize("temperature", [0.05, 0.5, 1.0, 2.0])
def test_draw_frequencies_follow_softmax_of_logits_over_temperature(temperature):
    """Each token is drawn with probability softmax(logits / T)_i: N draws at once (a batch
    of N identical rows), every token's count within 5 binomial sds (+1 draw) of N·p_i.
    At T = 0.05 with p = [0.6, 0.4, …] the second token is ~0.03%, the third ~0."""
    base = torch.tensor([0.6, 0.4, 0.25, 0.1]).log()
    n = 40_000
    g = torch.Generator().manual_seed(1)
    draws = pick(base.expand(n, -1).clone(), SamplingConfig(temperature=temperature), g)
    counts = torch.bincount(draws, minlength=4).double()
    p = torch.softmax(base.double() / temperature, dim=-1)
    bound = 5 * (n * p * (1 - p)).sqrt() + 1
    assert ((counts - n * p).abs() <= bound).all(), (temperature, counts.tolist(), (n * p).tolist())


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(top_k=-1), dict(max_new_tokens=-2),
                                 dict(max_new_tokens=gen.MAX_NEW_TOKENS + 1), dict(seed=-1), dict(seed=2**64)])
def test_bad_sampling_settings_are_user_errors(bad):
    from sanlab.errors import SanlabError

    with pytest.raises(SanlabError):
        SamplingConfig(**bad)


@pytest.mark.parametrize("sigma_length", ["prefix", "row"])
def test_mixit_cached_decoding_equals_full_forward(sigma_length):
    """MixiT with weights that depend on the position alone decodes through its V cache,
    with the logits of a full forward pass at every step (a hybrid with softmax layers too)."""
    for layout in ("uniform", "hybrid"):
        model = trained_looking(tiny(mixer="mixit", layout=layout, ffn=True,
                                     mixer_options={"seq_len": 32, "sigma_length": sigma_length}))
        prompt = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(6))
        greedy_against_full_forward(model, prompt, steps=10, max_len=32)


def test_mixit_with_document_lengths_decodes_by_full_forward():
    """With sigma_length=document every position's weights depend on the document's length,
    which grows with the context: no cache, the note says why, and decoding gives the
    full forward pass's tokens."""
    model = trained_looking(tiny(mixer="mixit", mixer_options={"seq_len": 32}))
    dec = Decoder(model, max_len=32)
    assert not dec.cached and "sigma_length=document" in dec.note
    prompt = torch.randint(0, 64, (5,), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(dec.prefill(prompt[None]), model(prompt[None])[:, -1])
    cfg = SamplingConfig(max_new_tokens=8, temperature=0)
    out = list(generate(model, prompt, cfg, max_len=32))
    context = prompt.clone()
    for tok in out:
        assert tok == int(model(context[None])[0, -1].argmax())
        context = torch.cat([context, torch.tensor([tok])])


# Options some mixers need at this size (MixiT's draw covers the context; FixedSeqQK draws
# its sequence, there is no data to bind it from).
# A window shorter than the context, so a cache that ignored it would show.
OPTIONS = {"mixit": {"seq_len": 32, "sigma_length": "prefix"}, "fixed_seq_qk": {"sequence": "random", "seq_len": 32},
           "sliding_window": {"window": 3}, "sink_window": {"sinks": 2, "window": 3}}


def decoding_equals_full_forward(model: LM, steps: int = 6, max_len: int = 32) -> Decoder:
    """Greedy decoding, cached or not: every step's logits are a full forward pass's."""
    dec = Decoder(model, max_len=max_len)
    prompt = torch.randint(0, 64, (5,), generator=torch.Generator().manual_seed(3))
    logits, context = dec.prefill(prompt[None]), prompt.clone()
    for _ in range(steps):
        torch.testing.assert_close(logits[0], model(context[None])[0, -1], atol=2e-5, rtol=2e-5)
        nxt = logits[0].argmax()
        context = torch.cat([context, nxt[None]])
        logits = dec.append(nxt.view(1, 1))
    return dec


@pytest.mark.parametrize("mixer", sorted(mixers.MIXERS))
def test_every_registered_mixer_decodes_as_its_full_forward(mixer):
    """A decode cache is inherited by subclasses (`SequenceMixer.decode_cache`): whatever cache
    a registered mixer has, its decoding is the full forward pass's, step by step; one
    without decodes by full forward passes and says so."""
    model = trained_looking(tiny(mixer=mixer, layout="hybrid", ffn=True, mixer_options=OPTIONS.get(mixer, {})))
    dec = decoding_equals_full_forward(model)
    assert dec.cached == (type(model.blocks[1].attn).decode_cache is not None)
    assert (dec.note is None) == dec.cached


def test_a_subclass_inherits_its_parents_cache_or_decodes_by_full_forward(monkeypatch):
    """Mixers registered from outside sanlab: a subclass of softmax attention that changes
    nothing the cache reads decodes through the KV cache it inherits; a subclass of a mixer
    without a cache decodes by full forward passes, and the note names it."""

    class MySoftmaxSpec(SoftmaxSpec):
        name = "my_softmax"

    class MySoftmax(SoftmaxAttention):
        spec = MySoftmaxSpec

    class MyStaticSpec(StaticEmbQKSpec):
        name = "my_static"

    class MyStatic(StaticEmbQK):
        spec = MyStaticSpec

    monkeypatch.setitem(mixers.MIXERS, "my_softmax", MySoftmaxSpec)  # what @register_mixer does
    monkeypatch.setitem(mixers.MIXERS, "my_static", MyStaticSpec)
    mine = trained_looking(tiny(mixer="my_softmax", layout="hybrid"))
    assert type(mine.blocks[1].attn) is MySoftmax
    dec = decoding_equals_full_forward(mine)
    assert dec.cached and dec.note is None
    static = trained_looking(tiny(mixer="my_static", layout="hybrid"))
    assert type(static.blocks[1].attn) is MyStatic
    dec = decoding_equals_full_forward(static)
    assert not dec.cached and "my_static" in dec.note
