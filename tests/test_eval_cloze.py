"""The built-in cloze on a plain-text corpus: each item is a held-out document cut at its
last space, and a model that has learned the corpus scores above 0 where an untrained one
scores 0, through `sanlab eval` itself, which prints its own table and nothing of lm-eval's."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from sanlab.cli import main

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval not installed")
WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain-text corpus of counting runs ("four five six seven"): every document's last word
    follows from the one before it, so a model that learned the corpus can complete held-out
    documents exactly."""
    root = tmp_path_factory.mktemp("cloze")
    rng = random.Random(0)
    with open(root / "counting.jsonl", "w") as f:
        for _ in range(600):
            start = rng.randrange(0, 6)
            f.write(json.dumps({"text": " ".join(WORDS[start:start + rng.randrange(3, 7)])}) + "\n")
    assert main(["prepare", "--corpus", "text", "--out", str(root / "data"), str(root / "counting.jsonl"),
                 "vocab_size=300", "seq_len=32", "val_frac=0.1"]) == 0
    return root


def test_text_cloze_is_the_document_cut_at_its_last_space(counting: Path) -> None:
    from sanlab.data.shards import load_manifest, unpack_documents
    from sanlab.data.tokenizer import load_tokenizer
    from sanlab.eval.builtin import _val_documents

    data = counting / "data"
    tok = load_tokenizer(data)
    items = _val_documents(data, load_manifest(data), 200, tok)
    docs = [tok.decode([int(i) for i in ids if i > 2], skip_special_tokens=True) for ids in unpack_documents(data, "val")]
    assert len(items) == len(docs) >= 40
    for (context, target), doc in zip(items, docs):
        assert context + " " + target == doc  # the whole document, nothing lost or doubled
        assert " " not in target and target in WORDS  # one word: the last one
        assert WORDS.index(target) == WORDS.index(context.split()[-1]) + 1


def _train(counting: Path, name: str, steps: int) -> Path:
    run = counting / name
    assert main(["train", "--out", str(run), f"data.dir={counting / 'data'}", "model.d_model=32", "model.n_layers=1",
                 "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=300", "data.seq_len=32",
                 f"train.steps={steps}", "train.batch_rows=8", "train.eval_every=0", "train.log_every=1000",
                 "train.precision=fp32", "train.device=cpu", "train.milestones=[0.0]"]) == 0
    return run


@needs_lm_eval
def test_a_model_that_learned_the_corpus_scores_the_cloze_above_zero(counting: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trained = _train(counting, "trained", 120)
    capsys.readouterr()
    assert main(["eval", str(trained), "--tasks", "sanlab_cloze", "--checkpoint", "milestone-000"]) == 0
    assert main(["eval", str(trained), "--tasks", "sanlab_cloze"]) == 0
    out = capsys.readouterr()
    at_init = json.loads((trained / "eval" / "results-milestone-000.json").read_text())["tasks"]["sanlab_cloze"]
    learned = json.loads((trained / "eval" / "results-latest.json").read_text())["tasks"]["sanlab_cloze"]
    n = learned["n_samples"]["effective"]
    assert n >= 40
    assert at_init["metrics"]["acc"] == 0.0  # an untrained model completes nothing exactly
    assert learned["metrics"]["acc"] >= 0.25  # one that learned the counting gets many right
    assert learned["metrics"]["perplexity"] < at_init["metrics"]["perplexity"]
    # sanlab's own output only: the table and the results lines, none of lm-eval's chatter
    lines = [ln for ln in out.out.splitlines() if ln.strip()]
    assert not any("bootstrapping" in ln or "INFO" in ln or "it/s" in ln for ln in lines + out.err.splitlines())
    assert f"{learned['metrics']['acc']:.4f} ± " in out.out and lines[-1] == f"results: {trained}/eval/results-latest.json"
