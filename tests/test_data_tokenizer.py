"""Tokenizer: atomic special ids, lossless bytes, and exact regions on hand-written documents."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from sanlab.data.regions import ANSWER, OTHER, QUERY, SPECIAL_TOKENS, TRACE, chat_document, text_document
from sanlab.data.tokenizer import MIN_VOCAB, encode_documents, load_tokenizer, save_tokenizer, train_tokenizer
from sanlab.errors import ConfigError, DataError

SAMPLE = ["The river of Velmora is the Kesh. Velmora was founded in 1204.", "What is 12 + 30? It is 42."] * 50


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(SAMPLE, 400)


def test_special_tokens_have_the_spec_ids(tok: Tokenizer) -> None:
    assert [tok.token_to_id(s) for s in SPECIAL_TOKENS] == list(range(8))
    assert SPECIAL_TOKENS[4:] == ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
    assert MIN_VOCAB <= tok.get_vocab_size() <= 400


def test_byte_fallback_round_trips_any_text(tok: Tokenizer) -> None:
    text = "naïve café — 日本語 🙂 \x00\ttabs"
    ids = tok.encode(text).ids
    assert 3 not in ids  # never UNK
    assert tok.decode(ids) == text


def test_regions_are_exact_on_a_hand_written_document(tok: Tokenizer) -> None:
    doc = chat_document("What is 12 + 30?", "12 + 30 = 42.", "It is 42.", "math")
    ((ids, regions),) = encode_documents(tok, [doc])
    assert len(ids) == len(regions)

    def text_of(region: int) -> str:
        return tok.decode([int(i) for i, r in zip(ids, regions) if r == region], skip_special_tokens=False)

    assert text_of(QUERY) == "user\nWhat is 12 + 30?"  # the role header counts with its turn
    assert text_of(TRACE) == "\n12 + 30 = 42.\n"
    assert text_of(ANSWER) == "assistant\n\nIt is 42."
    other = [int(i) for i, r in zip(ids, regions) if r == OTHER]
    newline = tok.encode("\n").ids
    assert other == [4, 5, *newline, 4, 6, 7, 5]  # markers and the newline between turns
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == doc.text


def test_literal_special_token_in_text_is_atomic_and_other(tok: Tokenizer) -> None:
    ((ids, regions),) = encode_documents(tok, [text_document("see <think> here")])
    assert 6 in ids.tolist()
    assert regions[ids.tolist().index(6)] == OTHER


def test_training_is_deterministic(tok: Tokenizer, tmp_path) -> None:
    a = save_tokenizer(tok, tmp_path).read_bytes()
    (tmp_path / "b").mkdir()
    b = save_tokenizer(train_tokenizer(SAMPLE, 400), tmp_path / "b").read_bytes()
    assert a == b
    assert load_tokenizer(tmp_path).encode("Velmora").ids == tok.encode("Velmora").ids


def test_vocab_smaller_than_special_and_byte_tokens_is_an_error() -> None:
    with pytest.raises(ConfigError, match="special tokens"):
        train_tokenizer(SAMPLE, 5)


def test_missing_or_broken_tokenizer_is_a_data_error(tmp_path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="not a valid tokenizer"):
        load_tokenizer(tmp_path)
