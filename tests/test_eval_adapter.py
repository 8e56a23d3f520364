"""The lm-eval adapter against direct forward passes of the same model on the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from analysis_rundirs import write_run  # noqa: E402
from sanlab.config import ModelConfig  # noqa: E402
from sanlab.data.regions import BOS_ID  # noqa: E402
from sanlab.eval.adapter import SanlabLM  # noqa: E402
from sanlab.eval.scoring import _pack  # noqa: E402

SEQ_LEN = 48


def eval_run(path: Path, data_dir: Path, ffn: bool = False, seed: int = 0) -> Path:
    """A run dir (untrained weights, gates moved off init) over the tiny prepared synth dir."""

    def perturb(m) -> None:
        for p in m.parameters():
            if p.ndim < 2:
                p.add_(0.3 * torch.randn(p.shape))

    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=320, ffn=ffn, init_std=0.1)
    write_run(path, cfg, {"latest": perturb}, data_dir=data_dir, seed=seed)
    raw = json.loads((path / "config.json").read_text())
    raw["data"]["seq_len"] = SEQ_LEN
    (path / "config.json").write_text(json.dumps(raw))
    return path


@pytest.fixture(scope="module")
def lm(tmp_path_factory, train_data_dir) -> SanlabLM:
    return SanlabLM(eval_run(tmp_path_factory.mktemp("eval") / "san", train_data_dir), batch_size=2)


def req(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def direct_logprob(lm: SanlabLM, ids: list[int], n_cont: int) -> tuple[float, bool]:
    """log p of the last n_cont tokens of `ids` from one unpacked forward pass."""
    with torch.no_grad():
        logp = torch.log_softmax(lm.loaded.model(torch.tensor([ids[:-1]]))[0], dim=-1)
    targets = torch.tensor(ids[1:])
    lp = logp.gather(-1, targets[:, None])[-n_cont:, 0]
    return lp.sum().item(), bool((logp.argmax(-1)[-n_cont:] == targets[-n_cont:]).all())


def test_loglikelihood_equals_direct_forward_in_one_packed_batch(lm):
    pairs = [
        ("<|im_start|>user\nWhere was Kaeth Dral born?<|im_end|>\n", "<|im_start|>assistant\n"),
        ("The river", " flows"),
        ("A", " b c d e f"),
        ("Question: how many lanterns are left? Answer:", " 12"),
        ("x " * 40, "end"),  # longer than seq_len: truncated from the left
        ("", "hello"),
        ("one two ", "three"),  # trailing space moves to the continuation
    ]
    got = lm.loglikelihood([req("loglikelihood", c, x) for c, x in pairs])
    assert len(got) == len(pairs)
    for (c, x), (ll, greedy) in zip(pairs, got):
        # lm-eval's split: trailing whitespace joins the continuation; the pair is encoded whole
        ctx = [BOS_ID] + lm.loaded.encode(c.rstrip())
        cont = lm.loaded.encode(c + x)[len(ctx) - 1 :]
        ids = (ctx + cont)[-(SEQ_LEN + 1) :]
        want, want_greedy = direct_logprob(lm, ids, min(len(cont), len(ids) - 1))
        assert ll == pytest.approx(want, abs=1e-4), (c, x)
        assert greedy == want_greedy
    assert lm.truncated >= 1


def test_packing_fills_rows_without_overflow():
    lengths = [10, 30, 5, 48, 17, 20, 28]
    rows = _pack(lengths, 48)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 48 for r in rows)
    assert len(rows) == 4  # 158 tokens need at least 4 rows of 48; first-fit decreasing finds 4


def test_rolling_loglikelihood_equals_sum_over_windows(lm):
    text = "The birthplace of the potter is a city by the river. " * 8
    ids = lm.loaded.encode(text)
    assert len(ids) > SEQ_LEN  # several windows
    (got,) = lm.loglikelihood_rolling([req("loglikelihood_rolling", text)])
    # disjoint blocks of SEQ_LEN predicted tokens; the first conditioned on BOS, every later
    # one on the tokens before it that fill its input to SEQ_LEN (one for a full block)
    want, start = 0.0, 0
    while start < len(ids):
        block = ids[start : start + SEQ_LEN]
        prev = [BOS_ID] if start == 0 else ids[start + len(block) - SEQ_LEN - 1 : start]
        w, _ = direct_logprob(lm, prev + block, len(block))
        want += w
        start += SEQ_LEN
    assert got == pytest.approx(want, abs=1e-3)


def test_generate_until_is_greedy_and_stops(lm):
    ctx = "<|im_start|>user\nWhere was Kaeth Dral born?<|im_end|>\n"
    (free,) = lm.generate_until([req("generate_until", ctx, {"max_gen_toks": 6})])
    ids = [BOS_ID] + lm.loaded.encode(ctx)
    want = []
    for _ in range(6):
        with torch.no_grad():
            nxt = int(lm.loaded.model(torch.tensor([ids + want]))[0, -1].argmax())
        if nxt == 1:  # EOS
            break
        want.append(nxt)
    assert free == lm.loaded.decode(want)
    if len(free) > 1:
        stop = free[len(free) // 2]
        (cut,) = lm.generate_until([req("generate_until", ctx, {"max_gen_toks": 6, "until": [stop]})])
        assert stop not in cut and free.startswith(cut)


def greedy_alone(lm: SanlabLM, ctx: str, max_new: int, until: list[str]) -> str:
    """The greedy continuation of one context from full forward passes (no cache, no batch):
    stopped at EOS, at the budget, or once the text holds a stop string, then cut there."""
    ids = lm.loaded.encode_document(ctx)
    new: list[int] = []
    for _ in range(max_new):
        with torch.no_grad():
            nxt = int(lm.loaded.model(torch.tensor([ids + new]))[0, -1].argmax())
        if nxt == 1:  # EOS
            break
        new.append(nxt)
        if any(u in lm.loaded.decode(new) for u in until):
            break
    text = lm.loaded.decode(new)
    for u in until:
        text = text.split(u)[0]
    return text


NAMES = ["Kaeth Dral", "Ilsa Morn", "Bram Tove", "Oda Wren", "Cyl Fane", "Tam Rook", "Esk Vale", "Nim Sorrel",
         "Ard Quill", "Pell Hask"]


def _same_length_contexts(lm: SanlabLM, n: int) -> list[str]:
    """n different contexts that encode to the same number of tokens (one decode batch)."""
    by_len: dict[int, list[str]] = {}
    for name in NAMES:
        for verb in ("born", "raised", "buried", "wed"):
            ctx = f"<|im_start|>user\nWhere was {name} {verb}?<|im_end|>\n"
            by_len.setdefault(len(lm.loaded.encode_document(ctx)), []).append(ctx)
    group = max(by_len.values(), key=len)
    assert len(group) >= n, {k: len(v) for k, v in by_len.items()}
    return group[:n]


def decode_batches(monkeypatch) -> list[int]:
    """The batch size of every `Decoder` that `generate_until`'s batches open, in order."""
    import sanlab.eval.adapter as adapter

    batches: list[int] = []

    class Counting(adapter.Decoder):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            batches.append(self.batch)

    monkeypatch.setattr(adapter, "Decoder", Counting)
    return batches


def test_greedy_requests_decode_in_batches_as_each_decodes_alone(lm, monkeypatch):
    """Same-length greedy requests decode as the rows of one batch (up to batch_size, 2
    here), each row stopping on its own; every answer is the one that request gets decoded
    alone, in the order asked, whatever the bucketing."""
    batches = decode_batches(monkeypatch)
    same = _same_length_contexts(lm, 5)
    asks = [(same[0], {"max_gen_toks": 6}), ("<|im_start|>user\nWho?<|im_end|>\n", {"max_gen_toks": 4}),
            (same[1], {"max_gen_toks": 6, "until": ["e", "a"]}), (same[2], {"max_gen_toks": 6}),
            (same[3], {"max_gen_toks": 3}), (same[4], {"max_gen_toks": 6, "until": "o"}),
            (same[0], {"max_gen_toks": 0})]
    got = lm.generate_until([req("generate_until", c, kw) for c, kw in asks])
    want = [greedy_alone(lm, c, kw["max_gen_toks"], [kw["until"]] if isinstance(kw.get("until"), str)
                         else kw.get("until", [])) for c, kw in asks]
    assert got == want
    assert any(w for w in want)  # the model says something, so the comparison has content
    # same[0,1,2,4] (budget 6): rows of 2 and 2; same[3] (budget 3), "Who?" and the empty budget alone
    assert sorted(batches) == [1, 1, 1, 2, 2], batches


def test_a_batch_row_stops_at_eos_and_ignores_what_its_row_decodes_later(lm, monkeypatch):
    """The batch's bookkeeping against a scripted decoder: each row's next token is its
    script's, the batch feeds back exactly the tokens it picked, a row that picks EOS (id 1)
    ends there while the others go on, and the batch stops once every row has."""
    import sanlab.eval.adapter as adapter

    V = lm.loaded.model.embed.weight.shape[0]
    script = [[40, 41, 1, 42, 43, 44, 45], [50, 51, 52, 53, 1, 55, 56], [1, 60, 61, 62, 63, 64, 65]]
    fed: list[list[int]] = []

    class Scripted:
        def __init__(self, model, max_len: int, batch: int) -> None:
            assert batch == 3
            self.step = 0
            fed.clear()

        def _logits(self) -> torch.Tensor:
            out = torch.zeros(3, V)
            for r, toks in enumerate(script):
                out[r, toks[self.step]] = 1.0
            return out

        def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
            assert tokens.shape[0] == 3
            return self._logits()

        def append(self, tokens: torch.Tensor) -> torch.Tensor:
            fed.append(tokens.view(-1).tolist())
            assert fed[-1] == [toks[self.step] for toks in script]  # the picked tokens, fed back
            self.step += 1
            return self._logits()

    monkeypatch.setattr(adapter, "Decoder", Scripted)
    ctx = _same_length_contexts(lm, 3)
    lm = SanlabLM(loaded=lm.loaded, batch_size=3)
    got = lm.generate_until([req("generate_until", c, {"max_gen_toks": 3}) for c in ctx])
    assert got == [lm.loaded.decode([40, 41]), lm.loaded.decode([50, 51, 52]), ""]
    assert len(fed) == 2  # three tokens: the prefill's and two appends, none past the budget
    got = lm.generate_until([req("generate_until", c, {"max_gen_toks": 6}) for c in ctx])
    assert got == [lm.loaded.decode([40, 41]), lm.loaded.decode([50, 51, 52, 53]), ""]
    assert len(fed) == 4  # every row ended (EOS) at the fifth token: no decode past it


def test_a_sampled_request_decodes_alone_on_its_seed(lm, monkeypatch):
    """do_sample: true goes through `generate` on its own seeded stream, as before
    batching: the same seed the same text, and never a batch row."""
    batches = decode_batches(monkeypatch)
    ctx = _same_length_contexts(lm, 2)
    kw = {"max_gen_toks": 8, "do_sample": True, "temperature": 1.0, "seed": 3}
    a, b, c = lm.generate_until([req("generate_until", ctx[0], kw), req("generate_until", ctx[1], kw),
                                 req("generate_until", ctx[0], kw)])
    assert a == c and batches == []
    from sanlab.model.generate import SamplingConfig, generate

    cfg = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=3)
    toks = []
    for t in generate(lm.loaded.model, torch.tensor(lm.loaded.encode_document(ctx[1])), cfg,
                      max_len=lm.loaded.seq_len, stop_ids=(1,)):
        if t == 1:
            break
        toks.append(t)
    assert b == lm.loaded.decode(toks)


def test_simple_evaluate_accepts_the_registered_name(tmp_path, train_data_dir):
    import lm_eval

    run = eval_run(tmp_path / "run", train_data_dir)
    from lm_eval.api.registry import get_model

    assert get_model("sanlab") is SanlabLM
    model = get_model("sanlab").create_from_arg_string(f"run_dir={run},checkpoint=latest", {"batch_size": 4})
    assert model.batch_rows == 4 and isinstance(model, lm_eval.api.model.LM)
