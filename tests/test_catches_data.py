"""Data properties SPEC §1.5 fixes, checked through what `prepare` writes.

- The special-token ids, read from the saved tokenizer (not from the project's own
  tuple, which would only check that tuple against itself) and from the packed rows.
- Validation is held out: the BPE is trained on training documents only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sanlab.data.prepare as prepare_mod
from sanlab.config import apply_overrides
from sanlab.data.prepare import PrepareConfig, corpus_documents, is_val, prepare
from sanlab.data.shards import doc_metadata, load_manifest, open_split, unpack_documents
from sanlab.data.regions import OTHER, QUERY, chat_document
from sanlab.data.tokenizer import encode_documents, load_tokenizer, train_tokenizer

# SPEC §1.5, written out literally.
SPEC_IDS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|im_start|>": 4, "<|im_end|>": 5,
            "<think>": 6, "</think>": 7}


def test_special_token_ids_are_the_specs_through_the_saved_tokenizer(train_data_dir: Path) -> None:
    tok = load_tokenizer(train_data_dir)
    assert {s: tok.token_to_id(s) for s in SPEC_IDS} == SPEC_IDS
    assert [tok.id_to_token(i) for i in range(8)] == list(SPEC_IDS)
    # The packed documents use them: [BOS] text [EOS], chat markers inside, PAD after the last one.
    docs = unpack_documents(train_data_dir, "train")
    assert len(docs) > 10
    for ids in docs:
        assert ids[0] == 2 and ids[-1] == 1
        assert 0 not in ids.tolist()
        assert ids[1] == 4 and ids[-2] == 5  # synth documents open and close a chat turn
        assert (ids == 6).sum() == (ids == 7).sum() == 1
    manifest = load_manifest(train_data_dir, verify=False)
    shards = open_split(train_data_dir, manifest, "train")
    tokens, owner = shards[-1]["tokens"][-1], shards[-1]["docs"][-1]  # the last row
    assert (owner == -1).any() == bool(manifest["splits"]["train"]["pad_tokens"])
    assert (tokens[owner == -1] == 0).all()  # padding is id 0


def test_the_tokenizer_is_trained_on_training_documents_only(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sample: list[str] = []
    real = prepare_mod.train_tokenizer

    def spy(texts, vocab_size):  # noqa: ANN001, ANN202 - same signature as the real one
        texts = list(texts)
        sample.extend(texts)
        return real(texts, vocab_size)

    monkeypatch.setattr(prepare_mod, "train_tokenizer", spy)
    cfg = apply_overrides(PrepareConfig, {}, ["tokens=20000", "seq_len=32", "vocab_size=320", "val_frac=0.2"])
    out = tmp_path / "data"
    prepare(cfg, out)

    # Where each corpus document went, from the prepared dir's own record of its source.
    split_of = {}
    for split in ("train", "val"):
        for source in doc_metadata(out, load_manifest(out, verify=False), split)["source"].tolist():
            split_of[int(source)] = split
    stream = corpus_documents(cfg)
    texts = [next(stream).plain_text() for _ in range(max(split_of) + len(sample) + 1)]
    index_of: dict[str, int] = {}
    for i, t in enumerate(texts):
        index_of.setdefault(t, i)
    assert sample and all(t in index_of for t in sample)
    val_texts = {texts[i] for i, s in split_of.items() if s == "val"}
    assert val_texts and not set(sample) & val_texts, "the BPE saw validation documents"
    # Documents the BPE saw but the budget left unpacked are classified by the split rule.
    for t in sample:
        i = index_of[t]
        assert split_of.get(i, "train") == "train" and not is_val(cfg.seed, i, cfg.val_frac)
    # The check has teeth: validation documents lie among the ones the BPE's sample was drawn from.
    last_sampled = max(index_of[t] for t in sample)
    assert any(s == "val" and i < last_sampled for i, s in split_of.items())


def test_a_literal_special_token_inside_a_turn_is_other() -> None:
    """A special-token string typed inside a query still becomes the atomic id, and (like
    every special token) counts as OTHER, not as the query it sits in."""
    tok = train_tokenizer(["plain words for a small tokenizer, see here"] * 20, 300)
    doc = chat_document("see <think> here", "ok", "fine", "math")
    ((ids, regions),) = encode_documents(tok, [doc])
    think = [i for i, t in enumerate(ids.tolist()) if t == 6]
    assert len(think) == 2  # the literal one in the query, then the trace's own marker
    assert all(regions[i] == OTHER for i in think)
    assert regions[think[0] - 1] == QUERY and regions[think[0] + 1] == QUERY
