"""Probe task generators: answers right by construction, answer-only loss mask,
reproducible seeds, disjoint splits, and impossible parameters refused."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from sanlab.data.loader import Loader
from sanlab.data.probes import TASKS, task_config, write_probe_dir
from sanlab.data.probes.base import FILLER
from sanlab.errors import ConfigError

# Small instances of every task (fast to generate and write).
SMALL = {
    "addition": ["digits=2", "n_train=300", "n_val=40", "n_test=60"],
    "modadd": ["p=13"],
    "memorize": ["n_train=200", "alphabet=5"],
    "retrieval": ["n_train=300", "n_val=40", "n_test=60", "m_max=6", "keys=8", "values=5"],
    "induction": ["n_train=300", "n_val=40", "n_test=60", "hops=3", "pairs=5", "nodes=8"],
    "dyck": ["n_train=300", "n_val=40", "n_test=60", "max_len=14"],
    "sentiment": ["n_train=300", "n_val=40", "n_test=60"],
}


def _gen(name: str, extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return TASKS[name].generate(task_config(name, [*SMALL[name], *extra]))


def _num(tokens: tuple[str, ...]) -> int:
    return int("".join(reversed(tokens)))


# --------------------------------------------------------------------------- answers


def test_addition_answers_are_the_sums_with_reversed_digits() -> None:
    gen = _gen("addition")
    for ex in [e for s in gen.splits.values() for e in s]:
        plus, eq = ex.prompt.index("+"), ex.prompt.index("=")
        a, b = _num(ex.prompt[:plus]), _num(ex.prompt[plus + 1 : eq])
        assert len(ex.answer) == 3 and _num(ex.answer) == a + b


def test_modadd_covers_every_pair_once_with_a_95_5_split() -> None:
    gen = _gen("modadd")
    pairs = []
    for ex in [e for s in gen.splits.values() for e in s]:
        a, b, c = (int(t[1:]) for t in (ex.prompt[0], ex.prompt[2], ex.answer[0]))
        assert c == (a + b) % 13
        pairs.append((a, b))
    assert sorted(pairs) == [(a, b) for a in range(13) for b in range(13)]
    assert len(gen.splits["train"]) == round(0.95 * 169)
    assert abs(len(gen.splits["val"]) - len(gen.splits["test"])) <= 1


def test_memorize_pairs_are_distinct_keys_with_labels_and_the_test_is_the_training_set() -> None:
    gen = _gen("memorize")
    train = gen.splits["train"]
    assert len(train) == 200 and gen.splits["test"] == train and gen.splits["val"] == train
    assert len({ex.prompt for ex in train}) == 200
    labels = [int(ex.answer[0][1:]) for ex in train]
    assert set(labels) <= set(range(5)) and len(set(labels)) == 5


def test_retrieval_answer_is_the_value_of_the_query_key() -> None:
    gen = _gen("retrieval")
    ms = set()
    for ex in [e for s in gen.splits.values() for e in s]:
        q = ex.prompt.index("?")
        keys, values = ex.prompt[:q:2], ex.prompt[1:q:2]
        assert len(set(keys)) == len(keys), "keys within an example must be distinct"
        ms.add(len(keys))
        assert ex.answer == (values[keys.index(ex.prompt[q + 1])],)
    assert ms == set(range(1, 7))


def test_induction_answer_follows_k_pointers() -> None:
    gen = _gen("induction")
    for ex in [e for s in gen.splits.values() for e in s]:
        bar = ex.prompt.index("|")
        src, dst = ex.prompt[:bar:2], ex.prompt[1:bar:2]
        assert len(set(src)) == len(src) == 5
        node, seen = ex.prompt[bar + 1], []
        for _ in range(3):
            seen.append(node)
            node = dst[src.index(node)]
        assert len(set(seen + [node])) == 4, "the chain visits k + 1 distinct nodes"
        assert ex.answer == (node,)


def _balanced_by_reduction(s: str) -> bool:
    while "()" in s:
        s = s.replace("()", "")
    return s == ""


def test_dyck_labels_match_an_independent_check_and_are_balanced_half_the_time() -> None:
    gen = _gen("dyck")
    exs = [e for s in gen.splits.values() for e in s]
    labels = []
    for ex in exs:
        s = "".join(ex.prompt[:-1])
        assert ex.prompt[-1] == "?" and len(s) % 2 == 0 and 2 <= len(s) <= 14
        assert ex.answer == ("yes" if _balanced_by_reduction(s) else "no",)
        labels.append(ex.answer[0] == "yes")
    assert 0.4 < np.mean(labels) < 0.6
    # Some unbalanced strings have as many '(' as ')': counting alone does not solve the task.
    assert any(ex.answer == ("no",) and ex.prompt.count("(") == ex.prompt.count(")") for ex in exs)


def test_sentiment_label_is_the_sign_of_negation_aware_polarity() -> None:
    from sanlab.data.probes.sentiment import NEGATIVE, POSITIVE

    gen = _gen("sentiment")
    flipped = 0
    for ex in [e for s in gen.splits.values() for e in s]:
        words, score = ex.prompt[:-1], 0
        for i, w in enumerate(words):
            v = (w in POSITIVE) - (w in NEGATIVE)
            if v and i and words[i - 1] == "not":
                v, flipped = -v, flipped + 1
            score += v
        assert score != 0 and ex.answer == ("pos" if score > 0 else "neg",)
    assert flipped > 0


# --------------------------------------------------------------------------- splits, seeds


@pytest.mark.parametrize("name", sorted(SMALL))
def test_splits_are_disjoint_and_seeds_reproduce(name: str) -> None:
    a, b, c = _gen(name), _gen(name), _gen(name, ("seed=1",))
    assert a.splits == b.splits
    assert a.splits["train"] != c.splits["train"]
    sets = {s: {ex.tokens for ex in v} for s, v in a.splits.items()}
    if TASKS[name].split_disjoint:
        assert not sets["train"] & sets["test"] and not sets["train"] & sets["val"] and not sets["val"] & sets["test"]
        assert all(len(sets[s]) == len(a.splits[s]) for s in sets)
    else:
        assert sets["train"] == sets["test"] == sets["val"]


# --------------------------------------------------------------------------- the prepared dir


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(d.glob("*.bin")) + [d / "tokenizer.json"]:
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_loss_mask_covers_exactly_the_answer_tokens(name: str, tmp_path: Path) -> None:
    from sanlab.data.tokenizer import load_tokenizer

    cfg = task_config(name, SMALL[name])
    gen = TASKS[name].generate(cfg)
    manifest = write_probe_dir(TASKS[name], cfg, tmp_path / name, row_tokens=64)
    assert (manifest["seq_len"] + 1) % manifest["probe"]["doc_length"] == 0
    tok = load_tokenizer(tmp_path / name)
    for split in ("train", "test"):
        loader = Loader(tmp_path / name, split=split, batch_rows=1)
        answers: dict[int, list[int]] = {}
        masked_docs: set[int] = set()
        for batch in loader.eval_batches(batch_rows=8):
            mask, docs, tgt = batch["loss_mask"], batch["doc_ids"], batch["targets"]
            assert (batch["region_ids"][mask] == 3).all()
            for d, t in zip(docs[mask].tolist(), tgt[mask].tolist()):
                answers.setdefault(d, []).append(t)
                masked_docs.add(d)
        examples = gen.splits[split]
        assert masked_docs == set(range(len(examples)))
        for i, ex in enumerate(examples):
            assert answers[i] == [tok.token_to_id(t) for t in ex.answer], (split, i)


def test_every_document_sits_whole_in_one_row(tmp_path: Path) -> None:
    cfg = task_config("retrieval", SMALL["retrieval"])
    write_probe_dir(TASKS["retrieval"], cfg, tmp_path / "r", row_tokens=100)
    loader = Loader(tmp_path / "r", split="train", batch_rows=1)
    rows = loader._gather(np.arange(loader.n_rows))
    docs = rows["docs"]
    first_row: dict[int, int] = {}
    for r in range(len(docs)):
        for d in set(docs[r].tolist()) - {-1}:
            assert first_row.setdefault(d, r) == r, f"document {d} is split across rows"
    tokens = rows["tokens"]
    assert len(np.flatnonzero(tokens.reshape(-1) == 2)) == len(first_row) == 300  # one BOS per example
    assert (tokens[:, 0] == 2).all(), "every row starts with a document"
    assert FILLER == "_" and 8 in tokens  # left fill: the first task token


def test_written_dirs_reproduce_byte_for_byte(tmp_path: Path) -> None:
    cfg = task_config("dyck", SMALL["dyck"])
    write_probe_dir(TASKS["dyck"], cfg, tmp_path / "a")
    write_probe_dir(TASKS["dyck"], cfg, tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    # Same request again: reused; a different one without force: refused.
    write_probe_dir(TASKS["dyck"], cfg, tmp_path / "a")
    with pytest.raises(ConfigError, match="other probe data"):
        write_probe_dir(TASKS["dyck"], task_config("dyck", [*SMALL["dyck"], "seed=3"]), tmp_path / "a")


def test_without_loss_regions_the_loader_masks_as_before(tmp_path: Path) -> None:
    import json

    cfg = task_config("modadd", ["p=7"])
    write_probe_dir(TASKS["modadd"], cfg, tmp_path / "m")
    answer_only = Loader(tmp_path / "m").batch(0)["loss_mask"].sum()
    path = tmp_path / "m" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["loss_regions"]
    path.write_text(json.dumps(manifest))
    every = Loader(tmp_path / "m").batch(0)["loss_mask"].sum()
    assert every > answer_only > 0
    manifest["loss_regions"] = ["nowhere"]
    path.write_text(json.dumps(manifest))
    from sanlab.errors import DataError

    with pytest.raises(DataError, match="loss_regions"):
        Loader(tmp_path / "m")


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name, items, message", [
    ("modadd", ["p=1"], "p must be at least 2"),
    ("retrieval", ["m_max=9", "keys=8"], "key space"),
    ("memorize", ["alphabet=1"], "alphabet must be at least 2"),
    ("memorize", ["n_train=17", "key_len=1"], "exceeds the 16 distinct keys"),
    ("addition", ["digits=1", "n_train=90"], "exceeds the 100 pairs"),
    ("induction", ["pairs=9", "nodes=8"], "nodes=8"),
    ("dyck", ["max_len=7"], "even"),
    ("sentiment", ["negation=1.5"], "negation"),
    ("retrieval", ["n_train=0"], "n_train must be at least 1"),
])
def test_impossible_task_parameters_are_one_line_errors(name: str, items: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        task_config(name, items)
    assert "\n" not in str(e.value)


def test_a_space_too_small_for_the_request_is_an_error_not_a_hang() -> None:
    with pytest.raises(ConfigError, match="distinct"):
        TASKS["dyck"].generate(task_config("dyck", ["max_len=4", "n_train=50"]))
