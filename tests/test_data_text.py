"""Real-text ingestion on small local files in every supported layout (offline)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sanlab.data.regions import ANSWER, OTHER, QUERY, TRACE
from sanlab.data.text import HFConfig, TextConfig, file_documents, hf_documents, kjv_documents
from sanlab.errors import DataError

SYNTH_RECORD = {"query": "Name a river.", "synthetic_reasoning": "Rivers flow.", "synthetic_answer": "The Kesh.",
                "exercise": "memorization", "language": "en"}  # fmt: skip


def _docs(tmp_path: Path, name: str, content: str | bytes, **cfg) -> list:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return list(file_documents(TextConfig(paths=[str(p)], **cfg)))


def test_txt_paragraphs_lines_and_whole_files(tmp_path: Path) -> None:
    text = "First para\nstill first.\n\n\nSecond para.\n"
    assert [d.text for d in _docs(tmp_path, "a.txt", text)] == ["First para\nstill first.", "Second para."]
    assert len(_docs(tmp_path, "b.txt", text, txt_split="line")) == 3
    (doc,) = _docs(tmp_path, "c.txt", text, txt_split="file")
    assert doc.text == text and doc.spans[0].region == OTHER and doc.exercise == "text"


def test_jsonl_plain_with_a_configurable_field(tmp_path: Path) -> None:
    lines = "\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(["alpha", "", "beta"]))
    assert [d.text for d in _docs(tmp_path, "a.jsonl", lines, field="body")] == ["alpha", "beta"]


def test_synth_schema_maps_to_chat_regions(tmp_path: Path) -> None:
    (doc,) = _docs(tmp_path, "s.jsonl", json.dumps(SYNTH_RECORD))
    assert doc.exercise == "memorization"
    assert doc.region_text(QUERY) == "user\nName a river."
    assert doc.region_text(TRACE) == "\nRivers flow.\n"
    assert doc.region_text(ANSWER) == "assistant\n\nThe Kesh."


def test_parquet_plain_and_synth_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["one", "two"], "n": [1, 2]}), tmp_path / "p.parquet")
    pq.write_table(pa.Table.from_pylist([SYNTH_RECORD] * 3), tmp_path / "s.parquet")
    docs = list(file_documents(TextConfig(paths=[str(tmp_path)])))  # a directory: sorted files
    assert [d.exercise for d in docs] == ["text", "text", "memorization", "memorization", "memorization"]


def test_missing_field_names_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no text field 'text' \(fields: body\)"):
        _docs(tmp_path, "a.jsonl", json.dumps({"body": "x"}))
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(DataError, match="no text column 'content'"):
        list(file_documents(TextConfig(paths=[str(tmp_path / "p.parquet")], field="content")))


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.txt", "", "file is empty"),
        ("blank.txt", "\n\n  \n", "no non-empty documents"),
        ("bad.jsonl", '{"text": "a"}\n{oops', r"bad.jsonl:2: malformed JSON"),
        ("bad.parquet", "not parquet", "not a readable parquet file"),
        ("latin.txt", b"caf\xe9", "not UTF-8"),
        ("a.csv", "x", "unsupported file type"),
    ],
)
def test_bad_files_are_data_errors(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    with pytest.raises(DataError, match=message):
        _docs(tmp_path, name, content)


def test_missing_path_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="input not found"):
        list(file_documents(TextConfig(paths=[str(tmp_path / "nope.txt")])))
    with pytest.raises(DataError, match="no input files"):
        list(file_documents(TextConfig()))


def test_hf_without_datasets_or_name_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="dataset name"):
        list(hf_documents(HFConfig()))
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="needs the `datasets` package"):
            list(hf_documents(HFConfig(name="PleIAs/SYNTH")))


def test_builtin_english_corpus_reads_chapters_offline() -> None:
    docs = kjv_documents()
    first, second = next(docs), next(docs)
    assert first.text.startswith("Genesis 1\nIn the beginning God created the heaven and the earth.")
    assert second.text.startswith("Genesis 2\n")
    assert first.exercise == "text"


def test_hf_records_stream_through_the_same_mapping(monkeypatch) -> None:
    """The HF path offline: a stand-in `datasets` module serves SYNTH and plain records."""
    calls = []

    def load_dataset(name, subset, split, streaming):
        calls.append((name, subset, split, streaming))
        return iter([SYNTH_RECORD, {"query": "", "synthetic_answer": ""}, SYNTH_RECORD])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    docs = list(hf_documents(HFConfig(name="PleIAs/SYNTH")))
    assert calls == [("PleIAs/SYNTH", None, "train", True)]
    assert len(docs) == 2 and docs[0].region_text(QUERY) == "user\nName a river."
    with pytest.raises(DataError, match="no text field 'content'"):
        list(hf_documents(HFConfig(name="x", field="content", record="plain")))
