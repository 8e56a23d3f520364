"""What every probe task shares: examples, splits, the task registry entry, the writer.

A probe task (SPEC §2: small synthetic tasks that show what an architecture can do at
all) is a seeded generator of `Example`s, each a prompt and an answer over the task's own
small vocabulary. `write_probe_dir` turns the examples into a prepared dir in the
regular shard format (`sanlab.data.shards`), so the regular trainer and loader train on
it unchanged:

- every example is one document `[BOS] filler… prompt answer [EOS]`, left-filled with
  the task's filler token to one length for the whole task, and the row length is a
  whole number of documents, so no example is ever cut at a row edge and the stream
  packing of `SplitWriter` applies as it is;
- prompt tokens are region QUERY, answer tokens ANSWER, BOS / EOS / filler OTHER;
- the manifest says `"loss_regions": ["answer"]`, which makes the loader's loss mask
  cover exactly the answer tokens (`sanlab.data.loader`);
- splits `train`, `val` (what the trainer evaluates and the LR sweep selects on) and
  `test` (what accuracy is reported on), disjoint unless the task says otherwise
  (memorization: all three are the training set).

Token ids: the SPEC's eight special tokens keep ids 0–7 (so `load_tokenizer` accepts the
dir), the task's tokens follow from id 8 in the order the task lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from pydantic import model_validator

from sanlab import __version__
from sanlab.config import StrictModel
from sanlab.data.regions import ANSWER, N_SPECIAL, OTHER, QUERY, REGION_NAMES, SPECIAL_TOKENS
from sanlab.data.shards import FORMAT, FORMAT_VERSION, MANIFEST, SplitWriter, sha256_file
from sanlab.errors import ConfigError
from sanlab.fileio import try_read_json_object
from sanlab.paths import staged_dir

SPLITS = ("train", "val", "test")
FILLER = "_"  # every task's first token: left fill up to the task's document length
TOKENIZER_FILE = "tokenizer.json"


class TaskConfig(StrictModel):
    """Settings every task has (`task.seed=…`, `task.n_train=…` on the command line)."""

    seed: int = 0
    n_train: int = 4000
    n_val: int = 256
    n_test: int = 512

    @model_validator(mode="after")
    def _check_counts(self) -> "TaskConfig":
        for key in ("n_train", "n_val", "n_test"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1, got {getattr(self, key)}")
        return self


@dataclass(frozen=True)
class Example:
    """One probe example as token strings of the task's vocabulary."""

    prompt: tuple[str, ...]
    answer: tuple[str, ...]

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.prompt + self.answer


@dataclass
class Generated:
    """A task's output: its vocabulary (without the specials) and its three splits."""

    vocab: list[str]
    splits: dict[str, list[Example]]
    info: dict[str, Any] = field(default_factory=dict)  # task facts worth recording (e.g. key space)


@dataclass(frozen=True)
class Column:
    """A column of the probe grid (SPEC §2) that is not a task's own accuracy: a reading
    derived from a task's runs (memorization capacity, from the memorize task)."""

    name: str
    label: str  # the grid's heading
    description: str = ""  # what `sanlab probe --list` says of it
    paper: Mapping[str, float | str] = field(default_factory=dict)  # SPEC §2's number per arm
    suite: bool = True  # one of `sanlab probe --suite`'s columns


@dataclass(frozen=True)
class ProbeTask:
    """A registered task: everything the runner, the suite, the records and the CLI read
    about it. `register_task(ProbeTask(...))` in a file of this package is the whole of a
    new task: nobody lists it by hand.

    `full` / `quick`: the overrides a run gets by default (`task.KEY=…` go to the task
    config, `model.*` / `optim.*` / `train.*` to the run config; the user's win). They are
    part of every run's config, so changing them changes the run ids of the task's runs.
    `paper`: SPEC §2's number per arm (test accuracy in %), or "≈ standard" where the
    paper says only that. `position`: where the task sits in lists and in the grid (SPEC
    §2's column order). `suite`: whether `sanlab probe --suite` runs it (SPEC §2's table
    has a column for it); `readings`: further columns read from its runs."""

    name: str
    config: type[TaskConfig]
    generate: Callable[[Any], Generated]
    description: str
    split_disjoint: bool = True  # False: val and test are the training set (memorization)
    label: str = ""  # the grid's heading (default: the name)
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    paper: Mapping[str, float | str] = field(default_factory=dict)
    position: int = 1000
    suite: bool = True
    readings: tuple[Column, ...] = ()

    def defaults(self, quick: bool) -> tuple[str, ...]:
        return self.quick if quick else self.full


# name -> task, filled by `register_task` as the package imports its files
TASKS: dict[str, ProbeTask] = {}


def register_task(task: ProbeTask) -> ProbeTask:
    """Register `task` under its name (a task file's last line: `TASK = register_task(...)`)."""
    other = TASKS.get(task.name)
    if other is not None and other is not task:
        raise ValueError(f"probe task {task.name!r} registered twice")
    bad = [d for d in (*task.full, *task.quick)
           if "=" not in d or d.split("=", 1)[0].split(".", 1)[0].strip() not in ("task", "model", "optim", "train")]
    if bad:
        raise ValueError(f"probe task {task.name!r}: default {bad[0]!r} is not a task.*/model.*/optim.*/train.* "
                         "key=value")
    TASKS[task.name] = task
    return task


def columns() -> list[Column]:
    """Every column of the grid in SPEC §2's order: each task's accuracy, then its readings."""
    out: list[Column] = []
    for t in sorted(TASKS.values(), key=lambda t: (t.position, t.name)):
        out.append(Column(t.name, t.label or t.name, t.description, t.paper, t.suite))
        out += t.readings
    return out


def task_vocab(*groups: Iterable[str]) -> list[str]:
    """The task vocabulary: the filler, then each group's tokens in order (no duplicates)."""
    out = [FILLER]
    for g in groups:
        for t in g:
            if t in out:
                raise ValueError(f"token {t!r} appears twice in a probe vocabulary")
            out.append(t)
    return out


def draw_distinct(
    draw: Callable[[np.random.Generator, int], Example],
    counts: Sequence[int],
    rng: np.random.Generator,
    *,
    what: str,
    max_tries_factor: int = 50,
) -> list[list[Example]]:
    """`counts[i]` examples for split i, all distinct (by tokens) across every split.

    `draw(rng, i)` returns one example (i is its index in the whole draw, which lets a
    generator stratify, e.g. alternate balanced / unbalanced). A space too small for the
    request is a `ConfigError` rather than an endless loop.
    """
    total = sum(counts)
    seen: set[tuple[str, ...]] = set()
    out: list[Example] = []
    tries = 0
    while len(out) < total:
        tries += 1
        if tries > max_tries_factor * total + 1000:
            raise ConfigError(
                f"task: cannot draw {total} distinct {what} examples (got {len(out)}); "
                "the task's space is too small for n_train + n_val + n_test"
            )
        ex = draw(rng, len(out))
        if ex.tokens not in seen:
            seen.add(ex.tokens)
            out.append(ex)
    splits, start = [], 0
    for c in counts:
        splits.append(out[start : start + c])
        start += c
    return splits


# --------------------------------------------------------------------------- writing


def _tokenizer_json(vocab: list[str]) -> str:
    """A word-level tokenizer over the specials and the task tokens (whitespace-split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    ids = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *vocab])}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=SPECIAL_TOKENS[3]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    for s in SPECIAL_TOKENS:
        tok.add_special_tokens([s])
    return json.dumps(json.loads(tok.to_str()), sort_keys=True, ensure_ascii=False)


def doc_length(gen: Generated) -> int:
    """Tokens per document of the task, BOS and EOS included."""
    return 2 + max(len(ex.tokens) for split in gen.splits.values() for ex in split)


def row_layout(doc_len: int, row_tokens: int) -> tuple[int, int]:
    """(documents per row, seq_len): rows of `seq_len + 1` = a whole number of documents,
    as close to `row_tokens + 1` as that allows (at least one document)."""
    per_row = max(1, (row_tokens + 1) // doc_len)
    return per_row, per_row * doc_len - 1


def encode(ex: Example, ids: dict[str, int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, region ids) of one example left-filled to `length` (BOS/EOS excluded)."""
    fill = length - len(ex.tokens)
    toks = [FILLER] * fill + list(ex.tokens)
    regions = [OTHER] * fill + [QUERY] * len(ex.prompt) + [ANSWER] * len(ex.answer)
    return np.asarray([ids[t] for t in toks], np.int64), np.asarray(regions, np.uint8)


@dataclass
class ProbeData:
    """A probe data dir, planned: the task generated in memory and its layout known, nothing
    written yet (`plan_probe_dir`). `write()` writes it (or returns the reused manifest), so a
    command can check every input, the run configs built on this layout included, before
    it creates anything."""

    task: ProbeTask
    cfg: TaskConfig
    out: Path
    row_tokens: int
    seq_len: int
    vocab_size: int
    rows: dict[str, int]  # rows per split, as the writer packs them
    existing: dict[str, Any] | None = None  # the manifest of a dir reused as it is
    gen: Generated | None = None

    def write(self) -> dict[str, Any]:
        """Write the dir (atomically) and return its manifest; a reused dir is left as it is."""
        if self.existing is not None:
            return self.existing
        assert self.gen is not None
        manifest = _write(self.task, self.cfg, self.gen, self.out, self.row_tokens)
        written = {s: manifest["splits"][s]["rows"] for s in SPLITS}
        if (manifest["seq_len"], manifest["vocab_size"], written) != (self.seq_len, self.vocab_size, self.rows):
            raise RuntimeError(f"{self.out}: written layout {manifest['seq_len']}, {manifest['vocab_size']}, "
                               f"{written} differs from the planned one")
        return manifest


def plan_probe_dir(task: ProbeTask, cfg: TaskConfig, out: str | Path, *, row_tokens: int = 256,
                   force: bool = False) -> ProbeData:
    """Generate `task` with `cfg` in memory and lay it out for `out`, writing nothing.

    An existing dir with the same task, config and row length is reused as it is
    (generation is deterministic, so it is not generated again); anything else there is
    a `ConfigError` unless `force`. A task whose space cannot hold the examples asked for
    is a `ConfigError` here, before anything is written.
    """
    out = Path(out)
    probe_key = {"task": task.name, "config": cfg.model_dump(mode="json"), "row_tokens": row_tokens}
    existing = out / MANIFEST
    if existing.is_file():
        old = try_read_json_object(existing) or {}
        probe = old.get("probe") if isinstance(old.get("probe"), dict) else {}
        if {k: probe.get(k) for k in probe_key} == probe_key:
            try:
                return ProbeData(task, cfg, out, row_tokens, int(old["seq_len"]), int(old["vocab_size"]),
                                 {s: int(old["splits"][s]["rows"]) for s in SPLITS}, existing=old)
            except (KeyError, TypeError, ValueError):
                pass  # this task's own dir with a damaged manifest: generated and written again
        elif not force:
            raise ConfigError(f"{out}: holds other probe data (use a new directory or --force)")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConfigError(f"{out}: exists and is not a probe data dir")
    gen = task.generate(cfg)
    per_row, seq_len = row_layout(doc_length(gen), row_tokens)
    rows = {s: -(-len(gen.splits[s]) // per_row) for s in SPLITS}  # every document has the same length
    return ProbeData(task, cfg, out, row_tokens, seq_len, _vocab_size(gen), rows, gen=gen)


def _vocab_size(gen: Generated) -> int:
    """The specials and the task's tokens, rounded up to a multiple of 8 (an embedding with a
    multiple-of-8 row count; the extra rows are never used)."""
    n = N_SPECIAL + len(gen.vocab)
    return n + (-n % 8)


def write_probe_dir(task: ProbeTask, cfg: TaskConfig, out: str | Path, *, row_tokens: int = 256,
                    force: bool = False) -> dict[str, Any]:
    """Generate `task` with `cfg` and write it as a prepared dir at `out` (atomically).

    Returns the manifest. An existing dir with the same task, config and row length is
    reused as it is (generation is deterministic); anything else there needs `force`.
    """
    return plan_probe_dir(task, cfg, out, row_tokens=row_tokens, force=force).write()


def _write(task: ProbeTask, cfg: TaskConfig, gen: Generated, out: Path, row_tokens: int) -> dict[str, Any]:
    probe_key = {"task": task.name, "config": cfg.model_dump(mode="json"), "row_tokens": row_tokens}
    length = doc_length(gen) - 2
    per_row, seq_len = row_layout(length + 2, row_tokens)
    vocab_size = _vocab_size(gen)
    ids = {t: N_SPECIAL + i for i, t in enumerate(gen.vocab)}

    with staged_dir(out) as tmp:
        tok_path = tmp / TOKENIZER_FILE
        tok_path.write_text(_tokenizer_json(gen.vocab))
        splits: dict[str, Any] = {}
        for split in SPLITS:
            w = SplitWriter(tmp, split, seq_len, vocab_size, shard_rows=1 << 20)
            for i, ex in enumerate(gen.splits[split]):
                toks, regions = encode(ex, ids, length)
                w.add(toks, regions, 0, i)
            splits[split] = w.finish([task.name])
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "sanlab_version": __version__,
            "corpus": f"probe:{task.name}",
            "seed": cfg.seed,
            "seq_len": seq_len,
            "vocab_size": vocab_size,
            "tokenizer_vocab_size": N_SPECIAL + len(gen.vocab),
            "token_dtype": "uint16",
            "tokenizer": {"path": TOKENIZER_FILE, "dtype": "json", "bytes": tok_path.stat().st_size,
                          "sha256": sha256_file(tok_path)},  # fmt: skip
            "regions": list(REGION_NAMES),
            "exercises": [task.name],
            "loss_regions": [REGION_NAMES[ANSWER]],
            "splits": splits,
            "config": {"probe": task.name, **cfg.model_dump(mode="json")},
            "probe": {**probe_key, "doc_length": length + 2, "docs_per_row": per_row,
                      "split_disjoint": task.split_disjoint, "info": gen.info},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest
