"""`sanlab prepare`: corpus → tokenizer → packed shards + manifest, written atomically.

    sanlab prepare --corpus synth --out data/synth --tokens 2M
    sanlab prepare --corpus kjv --out data/kjv
    sanlab prepare --corpus text notes/*.txt books.jsonl --out data/mine text.field=body
    sanlab prepare --corpus hf HuggingFaceFW/fineweb-edu hf.subset=sample-10BT --out data/fw --tokens 50M

Everything is built in a temp dir next to `--out` and renamed into place at the end, so an
interrupted or failed prepare never leaves a directory that looks complete (the manifest,
with its checksums, is the last file written).

The validation split is chosen per document by a seeded hash of its position in the
corpus stream, so it is disjoint from training by construction and independent of batch
sizes or chunking. The tokenizer is trained on training documents only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import model_validator
from rich.console import Console

from sanlab import __version__
from sanlab.config import StrictModel, Tokens, apply_overrides, load_toml, parse_tokens
from sanlab.data.floor import FLOOR_FILE, FloorCounter, floor_document
from sanlab.data.regions import REGION_NAMES, Document
from sanlab.data.shards import FORMAT, FORMAT_VERSION, MANIFEST, SplitWriter, sha256_file
from sanlab.data.synth import EXERCISES, SynthConfig, documents, world_for
from sanlab.data.text import HFConfig, TextConfig, file_documents, hf_documents, kjv_documents
from sanlab.data.tokenizer import (
    TOKENIZER_FILE,
    encode_documents,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
    vocab_problem,
)
from sanlab.errors import ConfigError, DataError
from sanlab.paths import check_out_dir, raise_no_space, staged_dir
from sanlab.tables import Output, Table, add_format_flag

CORPORA = ("synth", "text", "hf", "kjv")
_ENCODE_CHUNK = 256  # documents per batched encode call


class PrepareConfig(StrictModel):
    """Everything that determines a prepared dir (stored in its manifest)."""

    corpus: Literal["synth", "text", "hf", "kjv"] = "synth"
    """synth: the embedded generator; text: local files; hf: a Hugging Face dataset; kjv: built-in English."""
    tokens: Tokens | None = None  # training tokens to write (at least), e.g. 2M; None = whole corpus (not synth)
    seq_len: int = 256
    """Tokens per packed row (a row stores seq_len + 1 tokens for the shifted targets)."""
    vocab_size: int = 2048  # 16384 at paper scale (SPEC §1.5)
    val_frac: float = 0.02  # share of documents held out for validation
    seed: int = 0
    """Seed of the document stream (synth) and of the train/val split."""
    tokenizer: str | None = None  # reuse a tokenizer: a prepared dir or a tokenizer.json
    tokenizer_sample_chars: int = 4_000_000  # training text for the BPE (capped near the corpus size)
    shard_rows: int = 65_536
    """Rows per shard file."""
    synth: SynthConfig = SynthConfig()
    """Settings of the embedded generator (corpus = synth)."""
    text: TextConfig = TextConfig()
    """Settings for local files (corpus = text)."""
    hf: HFConfig = HFConfig()
    """Settings for a Hugging Face dataset (corpus = hf)."""

    @model_validator(mode="after")
    def _check(self) -> "PrepareConfig":
        problem = vocab_problem(self.vocab_size)
        if problem:
            raise ValueError(problem)
        if not 2 <= self.seq_len <= 65_534:  # segment ids are uint16
            raise ValueError(f"seq_len must lie in [2, 65534], got {self.seq_len}")
        if not 0.0 < self.val_frac < 1.0:
            raise ValueError(f"val_frac must lie in (0, 1), got {self.val_frac}")
        for key in ("tokens", "tokenizer_sample_chars", "shard_rows"):
            v = getattr(self, key)
            if v is not None and v <= 0:
                raise ValueError(f"{key} must be positive, got {v}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        return self


# --------------------------------------------------------------------------- pieces


def parse_count(raw: str) -> int:
    """'2M', '500k', '1e6', '2_000_000' -> int (`sanlab.config.parse_tokens`)."""
    try:
        return int(parse_tokens(raw))
    except ValueError:
        raise ConfigError(f"--tokens {raw!r}: expected a count such as 2M, 500k or 1e6") from None


def corpus_documents(cfg: PrepareConfig) -> Iterator[Document]:
    """The chosen corpus as a stream of documents."""
    if cfg.corpus == "synth":
        return documents(cfg.synth, cfg.seed)
    if cfg.corpus == "text":
        return file_documents(cfg.text)
    if cfg.corpus == "hf":
        return hf_documents(cfg.hf)
    return kjv_documents()


def is_val(seed: int, index: int, val_frac: float) -> bool:
    """Seeded per-document split: splitmix64 of (seed, index) as a uniform in [0, 1)."""
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x632BE59BD9B4E019) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    x ^= x >> 31
    return x / 2.0**64 < val_frac


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DataError(f"--out {out}: directory exists and is not empty (use --force to replace it)")


# --------------------------------------------------------------------------- prepare


def prepare(cfg: PrepareConfig, out: str | Path, *, force: bool = False,
            console: Console | Output | None = None) -> dict[str, Any]:
    """Tokenize and pack `cfg`'s corpus into `out`; returns the manifest. With a `console`
    (a rich console, or a `sanlab.tables.Output`) it reports progress and the summary."""
    out = Path(out)
    if console is not None and not isinstance(console, Output):
        console = Output.to_console(console)
    if cfg.corpus == "synth" and cfg.tokens is None:
        raise ConfigError("tokens: the synth corpus is endless; give --tokens N")
    check_out_dir(out, whole=True)  # written whole: swapped in by staged_dir
    _check_out(out, force)
    try:
        with staged_dir(out) as tmp:
            manifest = _build(cfg, tmp, console)
    except OSError as e:
        raise_no_space(e, f"the prepared data for {out} (nothing was written there)")
        raise
    if console is not None:
        print_summary(manifest, console, out, floor=_read_floor(out, manifest))
    return manifest


def _read_floor(out: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    name = manifest.get("entropy_floor_file")
    return json.loads((out / name).read_text()) if name else None


def _build(cfg: PrepareConfig, tmp: Path, console: Output | None) -> dict[str, Any]:
    stream = enumerate(corpus_documents(cfg))
    budget = cfg.tokens

    # Tokenizer: reuse one, or train on the first training documents (kept to pack later).
    buffered: list[tuple[int, Document]] = []
    if cfg.tokenizer is not None:
        tok = load_tokenizer(cfg.tokenizer)
    else:
        # ~4 characters per token: a small budget needs only about its own text to train on.
        want = cfg.tokenizer_sample_chars if budget is None else min(cfg.tokenizer_sample_chars, 5 * budget)
        chars = 0
        for index, doc in stream:
            buffered.append((index, doc))
            if not is_val(cfg.seed, index, cfg.val_frac):
                chars += len(doc.plain_text())
            if chars >= want:
                break
        sample = [d.plain_text() for i, d in buffered if not is_val(cfg.seed, i, cfg.val_frac)]
        if not sample:
            raise DataError("the corpus yielded no training documents")
        if console is not None:
            console.progress(f"training a {cfg.vocab_size}-token BPE on {sum(map(len, sample)):,} characters")
        tok = train_tokenizer(sample, cfg.vocab_size)
    # The manifest's vocab_size is the model's embedding size: the one asked for, even when
    # the BPE ran out of merges on a small corpus (ids then simply never reach the top rows).
    vocab = cfg.vocab_size
    if tok.get_vocab_size() > vocab:
        raise ConfigError(f"tokenizer {cfg.tokenizer} has {tok.get_vocab_size()} tokens, more than vocab_size={vocab}")
    tok_path = save_tokenizer(tok, tmp)

    exercises: dict[str, int] = {e: i for i, e in enumerate(EXERCISES)} if cfg.corpus == "synth" else {}
    writers = {s: SplitWriter(tmp, s, cfg.seq_len, vocab, cfg.shard_rows) for s in ("train", "val")}
    train = writers["train"]

    def chunks() -> Iterator[list[tuple[int, Document]]]:
        for i in range(0, len(buffered), _ENCODE_CHUNK):
            yield buffered[i : i + _ENCODE_CHUNK]
        chunk: list[tuple[int, Document]] = []
        for item in stream:
            chunk.append(item)
            if len(chunk) == _ENCODE_CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    # Once the training budget is met, documents are drawn only until the validation split
    # holds at least one, so even a tiny budget gives a usable prepared dir.
    val = writers["val"]
    floors = {"train": FloorCounter(), "val": FloorCounter()}
    has_floor = True  # every document so far carries its draw information
    finished = False
    for chunk in chunks():
        encoded = encode_documents(tok, [d for _, d in chunk])
        for (index, doc), (ids, regions) in zip(chunk, encoded):
            full = budget is not None and train.tokens >= budget
            finished = full and val.documents > 0
            if finished:
                break
            held_out = is_val(cfg.seed, index, cfg.val_frac)
            if full and not held_out:
                continue
            ex = exercises.setdefault(doc.exercise, len(exercises))
            (val if held_out else train).add(ids, regions, ex, index)
            if doc.draw_nats is None:
                has_floor = False
            elif has_floor:
                floors["val" if held_out else "train"].add(doc.exercise, regions, doc.draw_nats)
        if finished:
            break

    names = list(exercises)
    splits = {s: w.finish(names) for s, w in writers.items()}
    if splits["train"]["documents"] == 0:
        raise DataError("the corpus yielded no training documents")
    if splits["val"]["documents"] == 0:
        raise DataError(
            f"the validation split is empty ({splits['train']['documents']} documents in all): "
            "raise val_frac or give more text"
        )
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "sanlab_version": __version__,
        "corpus": cfg.corpus,
        "seed": cfg.seed,
        "seq_len": cfg.seq_len,
        "vocab_size": vocab,
        "tokenizer_vocab_size": tok.get_vocab_size(),
        "token_dtype": writers["train"].dtypes["tokens"],
        "tokenizer": {"path": TOKENIZER_FILE, "dtype": "json", "bytes": tok_path.stat().st_size,
                      "sha256": sha256_file(tok_path)},  # fmt: skip
        "regions": list(REGION_NAMES),
        "exercises": names,
        "splits": splits,
        "config": cfg.model_dump(mode="json"),
    }
    if has_floor:
        world = None
        if cfg.corpus == "synth":
            w = world_for(cfg.synth)
            info = w.information()
            world = {"people": len(w.people), "cities": len(w.cities), "countries": len(w.countries),
                     "facts": w.n_facts, "bits": info["bits"], "bits_per_fact": info["bits_per_fact"],
                     "attributes": info["attributes"]}
        (tmp / FLOOR_FILE).write_text(json.dumps(floor_document(floors, world), indent=1))
        manifest["entropy_floor_file"] = FLOOR_FILE
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


# --------------------------------------------------------------------------- summary


def _share_table(title: str, counts: dict[str, int], total: int, floors: dict[str, Any] | None = None) -> Table:
    table = Table(title)
    table.column("")
    table.column("tokens", "right")
    table.column("share", "right")
    if floors is not None:
        table.column("entropy floor", "right")
    for name, n in counts.items():
        if n:
            row = [name, f"{n:,}", f"{100 * n / max(total, 1):.1f}%"]
            if floors is not None:
                f = (floors.get(name) or {}).get("nats_per_token")
                row.append("–" if f is None else f"{f:.3f}")
            table.add_row(*row)
    return table


def _groups(counts: dict[str, int]) -> list[str]:
    return [k for k, n in counts.items() if n]


def print_summary(
    manifest: dict[str, Any], console: Output | Console, out: Path | None = None, floor: dict[str, Any] | None = None
) -> None:
    """Documents, tokens, rows per split; region / exercise-type token shares (training
    split) where the corpus has more than one of them (plain text is one region, `other`,
    and one type, so a one-row table would say nothing); and the entropy floor where the
    corpus has one (`sanlab.data.floor`)."""
    o = console if isinstance(console, Output) else Output.to_console(console)
    table = Table(f"prepared {manifest['corpus']} corpus" + (f" → {out}" if out else ""))
    for col in ("split", "documents", "tokens", "rows", "padding"):
        table.column(col, "right" if col != "split" else "left")
    for name, s in manifest["splits"].items():
        table.add_row(name, f"{s['documents']:,}", f"{s['tokens']:,}", f"{s['rows']:,}", f"{s['pad_tokens']:,}")
    o.table(table)
    train = manifest["splits"]["train"]
    ft = floor["splits"]["train"] if floor else None
    for what, key, floors in (("region", "region_tokens", ft["region"] if ft else None),
                              ("exercise type", "exercise_tokens", ft["exercise"] if ft else None)):
        groups = _groups(train[key])
        if len(groups) > 1:
            o.table(_share_table(f"train tokens by {what}", train[key], train["tokens"], floors))
        else:
            one = f"'{groups[0]}'" if groups else "none"
            o.note(f"no {what} table: every training token is of one {what} ({one})"
                   + (" — plain text has no chat turns" if what == "region" else ""))
    if ft:
        fv = floor["splits"]["val"]
        val_floor = "–" if fv["nats_per_token"] is None else f"{fv['nats_per_token']:.4f}"
        o.note(f"entropy floor {ft['nats_per_token']:.4f} nats/token (train), {val_floor} (val): a lower "
               f"bound on any model's mean loss on these documents ({FLOOR_FILE})")
        if floor.get("world"):
            wd = floor["world"]
            bits = (f"; {wd['bits']:,.0f} bits of information ({wd['bits_per_fact']:.2f} bits per fact, "
                    "each a uniform draw of the generator)" if wd.get("bits") is not None else "")
            o.note(f"world: {wd['facts']:,} facts ({wd['people']:,} people, {wd['cities']:,} cities){bits}")
    o.note(f"vocab {manifest['vocab_size']:,} (BPE uses {manifest['tokenizer_vocab_size']:,}) · "
           f"seq_len {manifest['seq_len']} · seed {manifest['seed']}")


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", choices=CORPORA, help="synth (default), text files, a Hugging Face dataset, or kjv (built-in English)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="the prepared dir to write")
    parser.add_argument("--tokens", metavar="N", help="training tokens to write, e.g. 2M, 500k, 1e6")
    parser.add_argument("--config", metavar="TOML", help="prepare settings (overridden by key=value)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    parser.add_argument("items", nargs="*", metavar="INPUT|key=value",
                        help="input files or dirs (text), a dataset name (hf), and key=value overrides")  # fmt: skip
    add_format_flag(parser)


def config_from_args(args: argparse.Namespace) -> PrepareConfig:
    data = load_toml(args.config) if args.config else {}
    source = args.config or "prepare"
    overrides = [i for i in args.items if "=" in i]
    inputs = [i for i in args.items if "=" not in i]
    if args.corpus:
        overrides.insert(0, f"corpus={args.corpus}")
    if args.tokens is not None:
        overrides.append(f"tokens={parse_count(args.tokens)}")
    cfg = apply_overrides(PrepareConfig, data, overrides, source=source)
    if inputs:
        if cfg.corpus == "text":
            cfg.text.paths = cfg.text.paths + inputs
        elif cfg.corpus == "hf" and len(inputs) == 1:
            cfg.hf.name = inputs[0]
        else:
            raise ConfigError(f"unexpected input {inputs[0]!r} for --corpus {cfg.corpus}")
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    with Output(args.format) as out:
        prepare(cfg, args.out, force=args.force, console=out)
    return 0
