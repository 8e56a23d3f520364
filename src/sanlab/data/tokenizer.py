"""Byte-level BPE with the SPEC's atomic special tokens, trained locally.

Byte fallback: the base alphabet is all 256 bytes (GPT-2 style byte-level BPE), so every
input string encodes and decodes losslessly and nothing is ever UNK. The special tokens
take ids 0–7 exactly (SPEC §1.5); the smallest possible vocabulary is therefore
8 + 256 = 264.

Region-exact tokenization: documents are encoded span by span (`encode_documents`), so a
token never straddles two regions and each token inherits its span's region. A literal
special-token string inside ordinary text still becomes its atomic id; such tokens are
OTHER like every special token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sanlab.data.regions import N_SPECIAL, OTHER, SPECIAL_IDS, SPECIAL_TOKENS, Document
from sanlab.errors import ConfigError, DataError

TOKENIZER_FILE = "tokenizer.json"
N_BYTES = 256
MIN_VOCAB = N_SPECIAL + N_BYTES


def vocab_problem(vocab_size: int) -> str | None:
    """Why `vocab_size` cannot work (it must hold the special and the 256 byte tokens), or None."""
    if vocab_size < MIN_VOCAB:
        return (
            f"vocab_size={vocab_size} is too small: it must hold the {N_SPECIAL} special tokens "
            f"plus {N_BYTES} byte tokens (at least {MIN_VOCAB})"
        )
    return None


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of at most `vocab_size` tokens on `texts` (deterministic).

    The result can be smaller than asked when the sample has fewer distinct merges;
    `Tokenizer.get_vocab_size()` is the truth and is what the manifest records.
    """
    problem = vocab_problem(vocab_size)
    if problem:
        raise ConfigError(problem)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    got = [tok.token_to_id(s) for s in SPECIAL_TOKENS]
    if got != list(range(N_SPECIAL)):  # a tokenizers-version change must not shift the ids silently
        raise RuntimeError(f"special tokens got ids {got}, expected 0..{N_SPECIAL - 1}")
    return tok


# The parts of tokenizer.json that decide the ids of a text: the rest (the post-processor
# an export adds for BOS, padding, truncation, key order, whitespace) never changes an id.
ENCODING_PARTS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "decoder")


def encoding_of(tok: Tokenizer) -> dict[str, object]:
    """What `tok` encodes and decodes by: vocabulary, merges, special ids, pre-tokenizer."""
    whole = json.loads(tok.to_str())
    return {k: whole.get(k) for k in ENCODING_PARTS}


def encoding_difference(a: Tokenizer, b: Tokenizer) -> str | None:
    """The first part in which two tokenizers encode differently (e.g. "the merges"), or
    None where every text gets the same ids from both."""
    ea, eb = encoding_of(a), encoding_of(b)
    if ea == eb:
        return None
    ma, mb = ea.get("model") or {}, eb.get("model") or {}
    if isinstance(ma, dict) and isinstance(mb, dict):
        for key, what in (("vocab", "the vocabulary"), ("merges", "the merges")):
            if ma.get(key) != mb.get(key):
                return what
    if ea["added_tokens"] != eb["added_tokens"]:
        return "the special tokens"
    return next(f"the {k.replace('_', '-')}" for k in ENCODING_PARTS if ea[k] != eb[k])


def save_tokenizer(tok: Tokenizer, directory: str | Path) -> Path:
    path = Path(directory) / TOKENIZER_FILE
    # tokenizers writes JSON with map iteration order; re-dump with sorted keys for byte-stable files.
    path.write_text(json.dumps(json.loads(tok.to_str()), sort_keys=True, ensure_ascii=False))
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer of a prepared dir (or a `tokenizer.json` file) and check its specials."""
    p = Path(path)
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.is_file():
        raise DataError(f"tokenizer not found: {p}")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{p}: not a valid tokenizer file ({str(e).splitlines()[0]})") from None
    got = [tok.token_to_id(s) for s in SPECIAL_TOKENS]
    if got != list(range(N_SPECIAL)):
        raise DataError(f"{p}: special tokens have ids {got}, expected 0..{N_SPECIAL - 1} (SPEC §1.5)")
    return tok


def encode_documents(
    tok: Tokenizer, docs: Sequence[Document]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids (int64) and region ids (uint8) of each document, span by span, no BOS/EOS.

    One batched call to the Rust encoder for all ordinary spans keeps this fast; special
    spans map straight to their ids.
    """
    texts: list[str] = []
    for d in docs:
        texts.extend(s.text for s in d.spans if s.text not in SPECIAL_IDS)
    encoded = iter(tok.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for d in docs:
        ids: list[np.ndarray] = []
        regions: list[np.ndarray] = []
        for s in d.spans:
            special = SPECIAL_IDS.get(s.text)
            piece = np.array([special], np.int64) if special is not None else np.asarray(next(encoded).ids, np.int64)
            ids.append(piece)
            regions.append(np.full(len(piece), s.region, np.uint8))
        tid = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        reg = np.concatenate(regions) if regions else np.zeros(0, np.uint8)
        reg[tid < N_SPECIAL] = OTHER
        out.append((tid, reg))
    return out
