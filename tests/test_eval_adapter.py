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


def test_simple_evaluate_accepts_the_registered_name(tmp_path, train_data_dir):
    import lm_eval

    run = eval_run(tmp_path / "run", train_data_dir)
    from lm_eval.api.registry import get_model

    assert get_model("sanlab") is SanlabLM
    model = get_model("sanlab").create_from_arg_string(f"run_dir={run},checkpoint=latest", {"batch_size": 4})
    assert model.batch_rows == 4 and isinstance(model, lm_eval.api.model.LM)
