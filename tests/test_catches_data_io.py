"""What the packed shards and the text readers give, value by value (bugs an audit planted
in `sanlab.data.shards` and `sanlab.data.text` that the rest of the suite let through).

- shards: the token dtype's edge (uint16 holds a vocabulary of exactly 65,536 ids), every
  shard but the last holds exactly `shard_rows` rows, and a manifest whose rows hold one
  token (seq_len 0: no input/target pair) is refused however well it agrees with its files.
- text: a line is a document without its newline; blank or whitespace-only text is no
  document in any layout; `record="auto"` reads SYNTH only when a record (or a parquet
  file) has both `query` and `synthetic_answer`; a SYNTH record with a query and no
  answer is still a document; a SYNTH record without an exercise is of type "unknown".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sanlab.data.regions import ANSWER, QUERY
from sanlab.data.shards import SplitWriter, check_manifest, token_dtype
from sanlab.data.text import TextConfig, file_documents
from sanlab.errors import DataError

# --------------------------------------------------------------------------- shards


def test_the_token_dtype_is_uint16_up_to_a_vocabulary_of_65536() -> None:
    assert [token_dtype(v) for v in (1, 65_535, 65_536, 65_537, 1 << 20)] == \
        ["uint16", "uint16", "uint16", "uint32", "uint32"]
    assert np.iinfo(np.dtype(token_dtype(65_536))).max == 65_535  # the largest id of that vocabulary fits


def _writer(directory: Path, seq_len: int, shard_rows: int, docs: int, doc_len: int) -> dict:
    w = SplitWriter(directory, "train", seq_len, vocab_size=300, shard_rows=shard_rows)
    rng = np.random.default_rng(0)
    for i in range(docs):
        ids = rng.integers(8, 300, doc_len)
        w.add(ids, np.zeros(doc_len, np.uint8), exercise=0, source=i)
    return w.finish(["text"])


def _manifest(split: dict, seq_len: int) -> dict:
    return {"seq_len": seq_len, "vocab_size": 300, "tokenizer": {}, "exercises": ["text"], "splits": {"train": split}}


def test_every_shard_but_the_last_holds_exactly_shard_rows_rows(tmp_path: Path) -> None:
    # 200 documents of 12 tokens in rows of 8: 300 rows, written in chunks of 64 rows, so
    # shards of 50 rows start part-way through a chunk.
    split = _writer(tmp_path, seq_len=7, shard_rows=50, docs=200, doc_len=10)
    assert split["rows"] == 300 and split["tokens"] == 2400 and split["pad_tokens"] == 0
    assert [s["rows"] for s in split["shards"]] == [50] * 6
    for s in split["shards"]:
        assert s["files"]["tokens"]["bytes"] == 50 * 8 * 2  # uint16
        assert (tmp_path / s["files"]["tokens"]["path"]).stat().st_size == 50 * 8 * 2
    check_manifest(_manifest(split, 7), tmp_path / "manifest.json")
    (tmp_path / "b").mkdir()
    split = _writer(tmp_path / "b", seq_len=7, shard_rows=50, docs=201, doc_len=10)
    assert [s["rows"] for s in split["shards"]] == [50] * 6 + [2]  # 301.5 rows: the last one padded


def test_a_manifest_of_one_token_rows_is_refused_though_its_files_agree(tmp_path: Path) -> None:
    split = _writer(tmp_path, seq_len=0, shard_rows=1000, docs=3, doc_len=2)
    assert split["rows"] == 12  # rows of one token: nothing to predict from
    with pytest.raises(DataError, match=r"seq_len must be an integer >= 1, got 0"):
        check_manifest(_manifest(split, 0), tmp_path / "manifest.json")


# --------------------------------------------------------------------------- text


def _docs(tmp_path: Path, name: str, content: str, **cfg) -> list:  # noqa: ANN003
    p = tmp_path / name
    p.write_text(content)
    return list(file_documents(TextConfig(paths=[str(p)], **cfg)))


def test_a_line_is_a_document_without_its_newline(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "a.txt", "First line\n\nsecond line\r\nlast", txt_split="line")
    assert [d.text for d in docs] == ["First line", "second line", "last"]  # \r\n read as \n


def test_whitespace_only_text_is_no_document(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no non-empty documents"):
        _docs(tmp_path, "blank.txt", " \n\t\n", txt_split="file")
    lines = "\n".join(json.dumps({"text": t}) for t in ["alpha", "   ", "\n\t", "beta"])
    assert [d.text for d in _docs(tmp_path, "a.jsonl", lines)] == ["alpha", "beta"]


def test_auto_reads_synth_only_with_both_query_and_answer(tmp_path: Path) -> None:
    lines = "\n".join(json.dumps(r) for r in [{"text": "a plain record", "query": "a field of its own"},
                                              {"text": "another", "synthetic_answer": "x"}])
    docs = _docs(tmp_path, "a.jsonl", lines)
    assert [(d.text, d.exercise) for d in docs] == [("a plain record", "text"), ("another", "text")]
    # a parquet file whose only columns are the two SYNTH ones is SYNTH
    pq.write_table(pa.table({"query": ["Name a river."], "synthetic_answer": ["The Kesh."]}), tmp_path / "s.parquet")
    (doc,) = file_documents(TextConfig(paths=[str(tmp_path / "s.parquet")]))
    assert doc.region_text(QUERY) == "user\nName a river."
    assert doc.region_text(ANSWER).endswith("The Kesh.")


def test_a_synth_record_with_a_query_and_no_answer_is_a_document_of_type_unknown(tmp_path: Path) -> None:
    lines = "\n".join(json.dumps(r) for r in [{"query": "Only a question?", "synthetic_answer": ""},
                                              {"query": "", "synthetic_answer": "Only an answer."},
                                              {"query": "", "synthetic_answer": None}])
    docs = _docs(tmp_path, "s.jsonl", lines)
    assert len(docs) == 2
    assert docs[0].region_text(QUERY) == "user\nOnly a question?"
    assert docs[1].region_text(ANSWER).endswith("Only an answer.")
    assert [d.exercise for d in docs] == ["unknown", "unknown"]
