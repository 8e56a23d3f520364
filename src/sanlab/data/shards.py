"""Packed shards on disk: rows of `seq_len + 1` tokens with segment, region and document ids.

Layout of a prepared dir (all arrays raw little-endian binaries, memory-mapped by the
loader; dtype and shape live in `manifest.json`, so no pickle and no header parsing):

    manifest.json                         counts, seq_len, vocab, tokenizer, checksums, config
    tokenizer.json
    {split}-{k:05d}.tokens.bin            (rows, seq_len+1)  uint16 (uint32 if vocab > 65536)
    {split}-{k:05d}.segments.bin          (rows, seq_len+1)  uint16, restarting at 0 in every row
    {split}-{k:05d}.regions.bin           (rows, seq_len+1)  uint8   (sanlab.data.regions)
    {split}-{k:05d}.docs.bin              (rows, seq_len+1)  int32   document index in the split, -1 = PAD
    {split}.doc_exercise.bin              (documents,)       uint16  index into manifest["exercises"]
    {split}.doc_length.bin                (documents,)       int32   tokens incl. BOS and EOS
    {split}.doc_source.bin                (documents,)       int64   position in the corpus stream

Packing (SPEC §1.5): documents are written as [BOS] text [EOS] one after another; a row
is the next `seq_len + 1` tokens of that stream, so a document that crosses a row edge
continues as a new segment at the start of the next row. Only the very last row of a
split is padded (PAD, region OTHER, document -1). Segment ids change wherever the
document id changes, which is all the trainer needs for the attention mask and the loss
mask. Checksums are computed while writing, so hashing costs no second pass.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from sanlab.data.regions import BOS_ID, EOS_ID, OTHER, PAD_ID, REGION_NAMES
from sanlab.errors import DataError
from sanlab.fileio import read_json

MANIFEST = "manifest.json"
FORMAT = "sanlab-prepared"
FORMAT_VERSION = 1
ROW_ARRAYS = ("tokens", "segments", "regions", "docs")
DOC_ARRAYS = {"exercise": "uint16", "length": "int32", "source": "int64"}
_ROW_DTYPES = {"segments": "uint16", "regions": "uint8", "docs": "int32"}
_CHUNK_ROWS = 64  # rows emitted per write: large enough to amortise numpy calls, small in memory


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class _HashedFile:
    """An append-only file that keeps its sha256 and size as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO = path.open("wb")
        self._h = hashlib.sha256()
        self.bytes = 0

    def write(self, arr: np.ndarray) -> None:
        buf = np.ascontiguousarray(arr).tobytes()
        self._f.write(buf)
        self._h.update(buf)
        self.bytes += len(buf)

    def close(self, dtype: str) -> dict[str, Any]:
        self._f.close()
        return {"path": self.path.name, "dtype": dtype, "bytes": self.bytes, "sha256": self._h.hexdigest()}


class SplitWriter:
    """Packs one split's documents into shards inside `directory` (a temp dir during prepare)."""

    def __init__(self, directory: Path, split: str, seq_len: int, vocab_size: int, shard_rows: int) -> None:
        self.directory = directory
        self.split = split
        self.row_len = seq_len + 1
        self.dtypes = {"tokens": token_dtype(vocab_size), **_ROW_DTYPES}
        self.shard_rows = shard_rows
        self._pending: dict[str, list[np.ndarray]] = {"tokens": [], "regions": [], "docs": []}
        self._pending_len = 0
        self._shards: list[dict[str, Any]] = []
        self._files: dict[str, _HashedFile] | None = None
        self._shard_rows_written = 0
        self.rows = 0
        self._doc_exercise: list[int] = []
        self._doc_length: list[int] = []
        self._doc_source: list[int] = []
        self.tokens = 0  # document tokens written or pending (BOS and EOS included, no padding)
        self.region_tokens = np.zeros(len(REGION_NAMES), np.int64)

    @property
    def documents(self) -> int:
        return len(self._doc_length)

    def add(self, ids: np.ndarray, regions: np.ndarray, exercise: int, source: int) -> None:
        """Append one document (token ids and region ids without BOS/EOS)."""
        doc = self.documents
        n = len(ids) + 2
        self._pending["tokens"].append(np.concatenate(([BOS_ID], ids, [EOS_ID])).astype(np.int64))
        self._pending["regions"].append(np.concatenate(([OTHER], regions, [OTHER])).astype(np.uint8))
        self._pending["docs"].append(np.full(n, doc, np.int32))
        self._pending_len += n
        self.tokens += n
        self._doc_exercise.append(exercise)
        self._doc_length.append(n)
        self._doc_source.append(source)
        self.region_tokens += np.bincount(self._pending["regions"][-1], minlength=len(REGION_NAMES))
        if self._pending_len >= _CHUNK_ROWS * self.row_len:
            self._emit(final=False)

    def _emit(self, final: bool) -> None:
        cat = {k: np.concatenate(v) for k, v in self._pending.items()}
        n_rows = self._pending_len // self.row_len
        if final and self._pending_len % self.row_len:
            pad = self.row_len - self._pending_len % self.row_len
            cat["tokens"] = np.concatenate((cat["tokens"], np.full(pad, PAD_ID, np.int64)))
            cat["regions"] = np.concatenate((cat["regions"], np.full(pad, OTHER, np.uint8)))
            cat["docs"] = np.concatenate((cat["docs"], np.full(pad, -1, np.int32)))
            n_rows += 1
        used = n_rows * self.row_len
        rows = {k: v[:used].reshape(n_rows, self.row_len) for k, v in cat.items()}  # (n_rows, L)
        # A new segment starts at every row start and wherever the document changes.
        starts = np.ones((n_rows, self.row_len), bool)
        starts[:, 1:] = rows["docs"][:, 1:] != rows["docs"][:, :-1]
        rows["segments"] = np.cumsum(starts, axis=1) - 1
        self._write_rows(rows)
        self._pending = {k: [v[used:]] for k, v in cat.items()}
        self._pending_len = len(cat["tokens"]) - used

    def _write_rows(self, rows: dict[str, np.ndarray]) -> None:
        start = 0
        n = len(rows["tokens"])
        while start < n:
            if self._files is None:
                k = len(self._shards)
                self._files = {a: _HashedFile(self.directory / f"{self.split}-{k:05d}.{a}.bin") for a in ROW_ARRAYS}
                self._shard_rows_written = 0
            take = min(n - start, self.shard_rows - self._shard_rows_written)
            for a in ROW_ARRAYS:
                self._files[a].write(rows[a][start : start + take].astype(self.dtypes[a]))
            self._shard_rows_written += take
            self.rows += take
            start += take
            if self._shard_rows_written == self.shard_rows:
                self._close_shard()

    def _close_shard(self) -> None:
        assert self._files is not None
        files = {a: f.close(self.dtypes[a]) for a, f in self._files.items()}
        self._shards.append({"rows": self._shard_rows_written, "files": files})
        self._files = None

    def finish(self, exercise_names: list[str]) -> dict[str, Any]:
        """Flush the last (padded) row, write per-document metadata; the split's manifest entry."""
        if self._pending_len:
            self._emit(final=True)
        if self._files is not None:
            self._close_shard()
        doc_files = {}
        for name, values in (("exercise", self._doc_exercise), ("length", self._doc_length),
                             ("source", self._doc_source)):  # fmt: skip
            f = _HashedFile(self.directory / f"{self.split}.doc_{name}.bin")
            f.write(np.asarray(values, DOC_ARRAYS[name]))
            doc_files[name] = f.close(DOC_ARRAYS[name])
        ex_tokens = np.bincount(self._doc_exercise, weights=self._doc_length, minlength=len(exercise_names))
        ex_docs = np.bincount(self._doc_exercise, minlength=len(exercise_names))
        return {
            "rows": self.rows,
            "documents": self.documents,
            "tokens": self.tokens,
            "pad_tokens": self.rows * self.row_len - self.tokens,
            "region_tokens": {r: int(c) for r, c in zip(REGION_NAMES, self.region_tokens)},
            "exercise_tokens": {e: int(c) for e, c in zip(exercise_names, ex_tokens)},
            "exercise_documents": {e: int(c) for e, c in zip(exercise_names, ex_docs)},
            "shards": self._shards,
            "doc_files": doc_files,
        }


# --------------------------------------------------------------------------- reading


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _check_file(directory: Path, entry: dict[str, Any], verify: bool) -> None:
    path = directory / entry["path"]
    if not path.is_file():
        raise DataError(f"{path}: shard file missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DataError(f"{path}: truncated or corrupt shard ({size} bytes, manifest says {entry['bytes']})")
    if verify and sha256_file(path) != entry["sha256"]:
        raise DataError(f"{path}: checksum mismatch (corrupt shard); prepare the data again")


def _int(value: Any, where: str, path: Path, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DataError(f"{path}: {where} must be an integer >= {low}, got {value!r}")
    return value


def _file_entry(entry: Any, where: str, path: Path) -> tuple[int, int]:
    """(bytes, itemsize) of a file entry, refusing a malformed one."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise DataError(f"{path}: {where} is not a file entry with a path")
    try:
        itemsize = np.dtype(entry.get("dtype")).itemsize
    except TypeError:
        raise DataError(f"{path}: {where}.dtype {entry.get('dtype')!r} is not a numpy dtype") from None
    return _int(entry.get("bytes"), f"{where}.bytes", path), itemsize


def check_manifest(manifest: dict[str, Any], path: Path) -> None:
    """The manifest must agree with itself and with the shape of its files: per split,
    the shards' rows add up to `rows`, every array file holds exactly rows × (seq_len+1)
    items of its dtype, every per-document file `documents` items, and document tokens
    plus padding fill the rows. (`_check_file` then checks the files hold those bytes.)
    A manifest that lies would otherwise surface as an IndexError deep in a loader.
    """
    row_len = _int(manifest.get("seq_len"), "seq_len", path, 1) + 1
    _int(manifest.get("vocab_size"), "vocab_size", path, 1)
    if not isinstance(manifest.get("tokenizer"), dict) or not isinstance(manifest.get("exercises"), list):
        raise DataError(f"{path}: malformed manifest (tokenizer / exercises)")
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise DataError(f"{path}: malformed manifest (no splits)")
    for name, split in splits.items():
        where = f"splits.{name}"
        if not isinstance(split, dict) or not isinstance(split.get("shards"), list):
            raise DataError(f"{path}: {where} has no list of shards")
        rows = _int(split.get("rows"), f"{where}.rows", path)
        docs = _int(split.get("documents"), f"{where}.documents", path)
        tokens = _int(split.get("tokens"), f"{where}.tokens", path)
        pad = _int(split.get("pad_tokens"), f"{where}.pad_tokens", path)
        shard_rows = 0
        for k, shard in enumerate(split["shards"]):
            if not isinstance(shard, dict) or not isinstance(shard.get("files"), dict):
                raise DataError(f"{path}: {where}.shards[{k}] has no files")
            n = _int(shard.get("rows"), f"{where}.shards[{k}].rows", path, 1)
            shard_rows += n
            missing = [a for a in ROW_ARRAYS if a not in shard["files"]]
            if missing:
                raise DataError(f"{path}: {where}.shards[{k}] lists no {missing[0]} file")
            for a, entry in shard["files"].items():
                size, item = _file_entry(entry, f"{where}.shards[{k}].files.{a}", path)
                if size != n * row_len * item:
                    raise DataError(f"{path}: {where}.shards[{k}].files.{a} says {size} bytes, but "
                                    f"{n} rows of {row_len} are {n * row_len * item} bytes")
        if shard_rows != rows:
            raise DataError(f"{path}: {where}.rows is {rows} but its shards hold {shard_rows} rows")
        if tokens + pad != rows * row_len:
            raise DataError(f"{path}: {where}: tokens ({tokens}) + pad_tokens ({pad}) != rows × (seq_len+1) "
                            f"({rows * row_len})")
        doc_files = split.get("doc_files")
        if not isinstance(doc_files, dict) or set(DOC_ARRAYS) - set(doc_files):
            raise DataError(f"{path}: {where}.doc_files must list {', '.join(DOC_ARRAYS)}")
        for key, entry in doc_files.items():
            size, item = _file_entry(entry, f"{where}.doc_files.{key}", path)
            if size != docs * item:
                raise DataError(f"{path}: {where}.doc_files.{key} says {size} bytes, but {docs} documents "
                                f"are {docs * item} bytes")


def load_manifest(data_dir: str | Path, verify: bool = True) -> dict[str, Any]:
    """Read a prepared dir's manifest and check every file it lists.

    Sizes are always checked; `verify` also compares sha256 checksums (one read of every
    file, about a second per GB).
    """
    d = Path(data_dir)
    path = d / MANIFEST
    if not path.is_file():
        raise DataError(f"{d}: not a prepared data dir (no {MANIFEST}); run `sanlab prepare --out {d}`")
    manifest = read_json(path, DataError, "manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} manifest")
    check_manifest(manifest, path)
    _check_file(d, manifest["tokenizer"], verify)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            for entry in shard["files"].values():
                _check_file(d, entry, verify)
        for entry in split["doc_files"].values():
            _check_file(d, entry, verify)
    return manifest


def open_split(data_dir: str | Path, manifest: dict[str, Any], split: str) -> list[dict[str, np.ndarray]]:
    """Read-only memory maps of a split's shards: one dict of (rows, seq_len+1) arrays per shard."""
    if split not in manifest["splits"]:
        raise DataError(f"{data_dir}: no split {split!r} (have {', '.join(manifest['splits'])})")
    d = Path(data_dir)
    row_len = manifest["seq_len"] + 1
    out = []
    for shard in manifest["splits"][split]["shards"]:
        out.append({
            a: np.memmap(d / e["path"], dtype=e["dtype"], mode="r", shape=(shard["rows"], row_len))
            for a, e in shard["files"].items()
        })  # fmt: skip
    return out


def doc_metadata(data_dir: str | Path, manifest: dict[str, Any], split: str) -> dict[str, np.ndarray]:
    """Per-document arrays of a split: `exercise` (index into manifest["exercises"]), `length`, `source`."""
    d = Path(data_dir)
    files = manifest["splits"][split]["doc_files"]
    return {k: np.fromfile(d / e["path"], dtype=e["dtype"]) for k, e in files.items()}


def unpack_documents(data_dir: str | Path, split: str) -> list[np.ndarray]:
    """Every document of a split as its [BOS] … [EOS] token sequence, in write order.

    Rows are consecutive pieces of one stream, so concatenating them and cutting at
    document-id changes inverts the packing exactly.
    """
    manifest = load_manifest(data_dir, verify=False)
    shards = open_split(data_dir, manifest, split)
    tokens = np.concatenate([s["tokens"].reshape(-1) for s in shards]).astype(np.int64)
    docs = np.concatenate([s["docs"].reshape(-1) for s in shards])
    keep = docs >= 0
    tokens, docs = tokens[keep], docs[keep]
    cuts = np.flatnonzero(np.diff(docs)) + 1
    return np.split(tokens, cuts)


def heldout_tokens(data_dir: str | Path, n: int, split: str = "val") -> np.ndarray:
    """The first `n` tokens of a split's document stream ([BOS] … [EOS] of its first
    document, then the next ones, in write order; no padding), fewer if it holds fewer.
    Rows are consecutive pieces of that stream, so only the first few are read."""
    manifest = load_manifest(data_dir, verify=False)
    out: list[np.ndarray] = []
    have = 0
    for shard in open_split(data_dir, manifest, split):
        for r in range(len(shard["tokens"])):
            if have >= n:
                break
            keep = shard["docs"][r] >= 0
            out.append(np.asarray(shard["tokens"][r][keep], np.int64))
            have += len(out[-1])
    return np.concatenate(out)[:n] if out else np.zeros(0, np.int64)
