"""`sanlab prepare` and the shards: packing, exact regions at row edges, determinism, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sanlab.cli import main
from sanlab.config import apply_overrides
from sanlab.data.loader import Loader, load_manifest
from sanlab.data.prepare import PrepareConfig, is_val, prepare
from sanlab.data.regions import ANSWER, BOS_ID, EOS_ID, OTHER, PAD_ID, QUERY, TRACE
from sanlab.data.shards import doc_metadata, open_split, unpack_documents
from sanlab.data.text import TextConfig, file_documents
from sanlab.data.tokenizer import encode_documents, load_tokenizer
from sanlab.errors import ConfigError, DataError

SMALL = ["tokens=6000", "seq_len=64", "vocab_size=400", "val_frac=0.1", "synth.people=30", "synth.cities=8"]


def _cfg(*overrides: str) -> PrepareConfig:
    return apply_overrides(PrepareConfig, {}, [*SMALL, *overrides])


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prep") / "synth"
    prepare(_cfg(), out)
    return out


# --------------------------------------------------------------------------- hand-written documents

RECORDS = [
    {"query": f"Question {i}: what is {i} plus {i}?", "synthetic_reasoning": f"{i} + {i} = {2 * i}.",
     "synthetic_answer": f"The sum is {2 * i}.", "exercise": "math" if i % 2 else "rag"}
    for i in range(12)
]  # fmt: skip


@pytest.fixture(scope="module")
def hand_dir(tmp_path_factory) -> tuple[Path, Path]:
    src = tmp_path_factory.mktemp("hand") / "docs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in RECORDS))
    out = src.parent / "prepared"
    # seq_len 16: every document is longer than a row, so each one is cut at row edges.
    prepare(apply_overrides(PrepareConfig, {}, ["corpus=text", "seq_len=16", "vocab_size=300",
                                                "val_frac=0.25", f"text.paths=[\"{src}\"]"]), out)  # fmt: skip
    return src, out


def test_packing_round_trips_and_regions_are_exact_across_row_edges(hand_dir) -> None:
    src, out = hand_dir
    tok = load_tokenizer(out)
    docs = list(file_documents(TextConfig(paths=[str(src)])))
    train = [d for i, d in enumerate(docs) if not is_val(0, i, 0.25)]
    expected = encode_documents(tok, train)
    # Unpacking gives back every training document's [BOS] ids [EOS], in order.
    unpacked = unpack_documents(out, "train")
    assert len(unpacked) == len(train)
    for got, (ids, _) in zip(unpacked, expected):
        assert got.tolist() == [BOS_ID, *ids.tolist(), EOS_ID]
    # Regions on disk match the span-exact encoding, including pieces continued in the next row.
    manifest = load_manifest(out)
    (shard,) = open_split(out, manifest, "train")
    flat_docs = shard["docs"].reshape(-1)
    flat_regions = shard["regions"].reshape(-1)[flat_docs >= 0]
    want = np.concatenate([np.concatenate(([OTHER], r, [OTHER])) for _, r in expected])
    assert flat_regions.tolist() == want.tolist()
    # The first document crosses the first row edge: it continues as segment 0 of row 1.
    assert shard["docs"][0, -1] == shard["docs"][1, 0] == 0
    assert shard["segments"][1, 0] == 0
    assert set(np.unique(shard["regions"])) == {OTHER, QUERY, TRACE, ANSWER}
    assert manifest["exercises"][:2] == ["rag", "math"]
    meta = doc_metadata(out, manifest, "train")
    assert [manifest["exercises"][e] for e in meta["exercise"]] == [d.exercise for d in train]


def test_no_target_crosses_a_document_boundary(hand_dir) -> None:
    _, out = hand_dir
    loader = Loader(out, batch_rows=4)
    b = loader.rows_batch(np.arange(loader.n_rows))
    inputs_doc = np.concatenate([s["docs"][:, :-1] for s in open_split(out, loader.manifest, "train")])
    mask = b["loss_mask"].numpy()
    assert (b["doc_ids"].numpy()[mask] == inputs_doc[mask]).all()  # target in the input's document
    assert not mask[b["targets"].numpy() == BOS_ID].any()  # the EOS -> next BOS step is masked
    assert not mask[b["targets"].numpy() == PAD_ID].any()
    eos_in = b["inputs"].numpy() == EOS_ID
    assert not mask[eos_in].any()
    assert mask.sum() > 0.8 * mask.size


# --------------------------------------------------------------------------- the synth corpus


def test_prepare_writes_a_complete_manifest(synth_dir: Path) -> None:
    m = load_manifest(synth_dir)
    assert m["seq_len"] == 64 and m["vocab_size"] == 400 and m["corpus"] == "synth"
    assert m["tokenizer_vocab_size"] <= 400
    train, val = m["splits"]["train"], m["splits"]["val"]
    assert train["tokens"] >= 6000 and val["documents"] > 0
    assert sum(train["region_tokens"].values()) == train["tokens"]
    assert sum(train["exercise_tokens"].values()) == train["tokens"]
    assert train["rows"] * 65 == train["tokens"] + train["pad_tokens"]
    assert m["config"]["synth"]["people"] == 30


def test_validation_is_disjoint_from_training_by_document(synth_dir: Path) -> None:
    m = load_manifest(synth_dir)
    train = set(doc_metadata(synth_dir, m, "train")["source"].tolist())
    val = set(doc_metadata(synth_dir, m, "val")["source"].tolist())
    assert val and not train & val
    assert len(train) == m["splits"]["train"]["documents"] and len(val) == m["splits"]["val"]["documents"]


def test_same_seed_gives_byte_identical_shards(synth_dir: Path, tmp_path: Path) -> None:
    prepare(_cfg(), tmp_path / "again")
    prepare(_cfg("seed=1"), tmp_path / "other")
    names = sorted(p.name for p in synth_dir.iterdir())
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (synth_dir / name).read_bytes(), name
    assert (tmp_path / "other" / "train-00000.tokens.bin").read_bytes() != (
        synth_dir / "train-00000.tokens.bin"
    ).read_bytes()


def test_shards_roll_over_and_load_across_shards(synth_dir: Path, tmp_path: Path) -> None:
    prepare(_cfg("shard_rows=7"), tmp_path / "sharded")
    m = load_manifest(tmp_path / "sharded")
    assert len(m["splits"]["train"]["shards"]) > 1
    a = Loader(synth_dir, batch_rows=8, seed=5).batch(3)
    b = Loader(tmp_path / "sharded", batch_rows=8, seed=5).batch(3)
    assert all((a[k] == b[k]).all() for k in a)


def test_reusing_a_tokenizer(synth_dir: Path, tmp_path: Path) -> None:
    prepare(_cfg(f"tokenizer={synth_dir}", "seed=2"), tmp_path / "reuse")
    assert (tmp_path / "reuse" / "tokenizer.json").read_bytes() == (synth_dir / "tokenizer.json").read_bytes()
    with pytest.raises(ConfigError, match="more than vocab_size=300"):
        prepare(_cfg(f"tokenizer={synth_dir}", "vocab_size=300"), tmp_path / "small")


# --------------------------------------------------------------------------- bad input


def test_corrupt_or_truncated_shard_is_caught_by_checksum(synth_dir: Path, tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(synth_dir, bad)
    shard = bad / "train-00000.tokens.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="checksum mismatch"):
        Loader(bad)
    shard.write_bytes(bytes(data[:-7]))
    with pytest.raises(DataError, match="truncated"):
        load_manifest(bad, verify=False)
    (bad / "manifest.json").unlink()
    with pytest.raises(DataError, match="not a prepared data dir"):
        Loader(bad)


def test_a_failed_prepare_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text field"}))
    with pytest.raises(DataError, match="no text field"):
        prepare(_cfg("corpus=text", f'text.paths=["{src}"]'), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]  # no out, no temp dir


def test_existing_output_needs_force(synth_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare(_cfg(), out)
    with pytest.raises(DataError, match="--force"):
        prepare(_cfg(), out)
    prepare(_cfg("seed=3"), out, force=True)
    assert load_manifest(out)["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    "override, message",
    [("vocab_size=5", "special tokens"), ("seq_len=0", "seq_len"), ("val_frac=1.5", "val_frac"),
     ("synth.nope=1", "unknown key")],
)  # fmt: skip
def test_bad_config_is_a_config_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(override)


# --------------------------------------------------------------------------- CLI


def test_cli_prepares_and_prints_shares(tmp_path: Path, capsys) -> None:
    code = main(["prepare", "--out", str(tmp_path / "d"), "--tokens", "20k", "vocab_size=300", "seq_len=32",
                 "val_frac=0.2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    for word in ("train", "val", "query", "trace", "answer", "memorization", "multihop", "entropy floor", "world"):
        assert word in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--corpus", "text", "{tmp}/missing.txt"], "input not found"),
        (["--corpus", "text", "{tmp}/empty.txt"], "file is empty"),
        (["--corpus", "text", "{tmp}/body.jsonl"], "no text field 'text'"),
        (["--corpus", "synth"], "give --tokens"),
        (["--tokens", "lots"], "expected a count"),
        (["--tokens", "1k", "vocab_size=100"], "vocab_size"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "body.jsonl").write_text(json.dumps({"body": "x"}))
    argv = ["prepare", "--out", str(tmp_path / "out")] + [a.format(tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sanlab: error:") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_builtin_english_corpus_prepares_offline(tmp_path: Path) -> None:
    m = prepare(apply_overrides(PrepareConfig, {}, ["corpus=kjv", "tokens=4000", "vocab_size=400", "seq_len=64"]),
                tmp_path / "kjv")  # fmt: skip
    assert m["exercises"] == ["text"] and m["splits"]["val"]["documents"] >= 1
    assert m["splits"]["train"]["region_tokens"]["other"] == m["splits"]["train"]["tokens"]
    assert unpack_documents(tmp_path / "kjv", "train")[0].tolist()[0] == BOS_ID
