"""Deterministic, resumable, rank-sharded batches from a prepared dir.

The loader is a pure function of (seed, step, rank, world_size): the global row stream is
the concatenation of one seeded permutation of all rows per epoch, and global step `s`
takes stream positions `[s·B, (s+1)·B)` (B = global `batch_rows`), of which rank `r`
takes the `r`-th contiguous `B / world_size`. Hence every epoch is one full pass without
replacement, ranks are disjoint and jointly cover the stream, and the state to resume is
just the step — resuming even on a different world size replays the same global batches.

The validation split has one fixed row order (seeded by the prepare seed, not the
training seed), so every run of a study is evaluated on exactly the same rows.

Batch layout (docs/architecture.md, "Data"): each row of `seq_len + 1` tokens gives
`inputs = row[:-1]`, `targets = row[1:]`; `segment_ids` are the inputs' segments (for the
attention mask), `region_ids` / `doc_ids` describe the target token, and `loss_mask` is
true only where the target stays in its input's segment and is not PAD — so the
EOS → next BOS step and the padding of the last row never count. A manifest with
`"loss_regions": [names]` (the probe tasks: `["answer"]`) also restricts the mask to
targets in those regions.

Prefetching was measured and not added: a batch is a few memmap row copies, hundreds of
times faster than a CPU training step consumes it (benchmarks/bench_data.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from sanlab.data.regions import PAD_ID, REGION_NAMES
from sanlab.data.shards import doc_metadata, load_manifest, open_split
from sanlab.errors import ConfigError, DataError

__all__ = ["Batch", "Loader", "load_manifest"]  # load_manifest is part of this module's contract

Batch = dict[str, torch.Tensor]
_VAL_SALT = 0x5A11  # separates the fixed validation order from any training permutation


class Loader:
    """Batches of one split of a prepared dir.

    `batch_rows` is the *global* batch (as `train.batch_rows`); each rank gets
    `batch_rows // world_size` rows per step, which must divide evenly.
    """

    def __init__(
        self,
        data_dir: str | Path,
        split: str = "train",
        batch_rows: int = 16,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        *,
        verify: bool = True,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank} is not in [0, world_size={world_size})")
        if batch_rows <= 0 or batch_rows % world_size:
            raise ConfigError(f"batch_rows={batch_rows} must be a positive multiple of world_size={world_size}")
        self.data_dir = Path(data_dir)
        self.manifest: dict[str, Any] = load_manifest(self.data_dir, verify=verify)
        self._shards = open_split(self.data_dir, self.manifest, split)
        self.split = split
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.batch_rows = batch_rows
        self.local_rows = batch_rows // world_size
        self.seq_len: int = self.manifest["seq_len"]
        self.vocab_size: int = self.manifest["vocab_size"]
        self.n_rows: int = self.manifest["splits"][split]["rows"]
        if self.n_rows == 0:
            raise DataError(f"{self.data_dir}: split {split!r} has no rows")
        self._starts = np.cumsum([0] + [len(s["tokens"]) for s in self._shards])  # first row of each shard
        meta = doc_metadata(self.data_dir, self.manifest, split)
        self.exercise_names: list[str] = list(self.manifest["exercises"])
        self.doc_exercise: np.ndarray = meta["exercise"].astype(np.int64)  # (documents,)
        entry = self.manifest["splits"][split]
        if len(self.doc_exercise) and self.doc_exercise.max() >= len(self.exercise_names):
            raise DataError(f"{self.data_dir}: split {split!r} has documents of exercise type "
                            f"{int(self.doc_exercise.max())}, but the manifest names {len(self.exercise_names)}")
        if int(meta["length"].sum()) != entry["tokens"]:
            raise DataError(f"{self.data_dir}: split {split!r}: its documents hold {int(meta['length'].sum())} "
                            f"tokens, the manifest says {entry['tokens']}; prepare the data again")
        self.loss_regions: np.ndarray | None = None  # region ids the loss is restricted to
        if "loss_regions" in self.manifest:
            names = self.manifest["loss_regions"]
            if not isinstance(names, list) or not names or any(n not in REGION_NAMES for n in names):
                raise DataError(f"{self.data_dir}: manifest loss_regions must be a non-empty list of "
                                f"{', '.join(REGION_NAMES)}; got {names!r}")
            self.loss_regions = np.asarray([REGION_NAMES.index(n) for n in names])
        self.step = 0
        self._orders: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ row order

    @property
    def tokens_per_step(self) -> int:
        """Global input tokens per step (all ranks)."""
        return self.batch_rows * self.seq_len

    @property
    def steps_per_epoch(self) -> float:
        return self.n_rows / self.batch_rows

    def _order(self, epoch: int) -> np.ndarray:
        """The row permutation of `epoch` (validation: one fixed order for every epoch)."""
        if self.split == "val":
            epoch = 0
            key = [int(self.manifest["seed"]), _VAL_SALT]
        else:
            key = [self.seed, epoch]
        if epoch not in self._orders:
            if len(self._orders) >= 2:  # a batch touches at most two consecutive epochs
                self._orders.pop(min(self._orders))
            self._orders[epoch] = np.random.default_rng(key).permutation(self.n_rows)
        return self._orders[epoch]

    def _rows_at(self, positions: np.ndarray) -> np.ndarray:
        """Row indices at global stream positions."""
        epochs = positions // self.n_rows
        out = np.empty(len(positions), np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._order(int(e))[positions[sel] % self.n_rows]
        return out

    def rows_for_step(self, step: int) -> np.ndarray:
        """This rank's row indices at `step`: (local_rows,)."""
        first = step * self.batch_rows + self.rank * self.local_rows
        return self._rows_at(np.arange(first, first + self.local_rows, dtype=np.int64))

    # ------------------------------------------------------------------ batches

    def _gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The four arrays of `rows`, each (len(rows), seq_len + 1)."""
        if len(self._shards) == 1:
            return {a: np.asarray(v[rows]) for a, v in self._shards[0].items()}
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        out = {a: np.empty((len(rows), self.seq_len + 1), v.dtype) for a, v in self._shards[0].items()}
        for s in np.unique(shard):
            sel = shard == s
            for a, v in self._shards[s].items():
                out[a][sel] = v[rows[sel] - self._starts[s]]
        return out

    def rows_batch(self, rows: np.ndarray) -> Batch:
        """The batch dict for explicit row indices (B rows -> tensors of (B, seq_len))."""
        r = self._gather(rows)
        tokens = r["tokens"].astype(np.int64)  # (B, T+1)
        seg = r["segments"].astype(np.int64)  # (B, T+1)
        targets = tokens[:, 1:]
        mask = (seg[:, 1:] == seg[:, :-1]) & (targets != PAD_ID)
        if self.loss_regions is not None:
            mask &= np.isin(r["regions"][:, 1:], self.loss_regions)

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a))

        return {
            "inputs": t(tokens[:, :-1]),
            "targets": t(targets),
            "segment_ids": t(seg[:, :-1]),
            "region_ids": t(r["regions"][:, 1:].astype(np.int64)),
            "loss_mask": t(mask),
            "doc_ids": t(r["docs"][:, 1:].astype(np.int64)),
        }

    def batch(self, step: int) -> Batch:
        """This rank's batch at global `step` (a pure function of seed, step, rank, world_size)."""
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        return self.rows_batch(self.rows_for_step(step))

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        b = self.batch(self.step)
        self.step += 1
        return b

    def eval_batches(self, n_rows: int | None = None, batch_rows: int | None = None) -> Iterator[Batch]:
        """A fixed set of rows for evaluation: the first `n_rows` (default all) of the split's order.

        Rank `r` takes every `world_size`-th of those rows, in batches of `batch_rows`
        (default `local_rows`); sum the masked losses and token counts over the batches and
        all-reduce once afterwards. For `split="val"` the rows are the same in every run.
        """
        n = self.n_rows if n_rows is None else min(n_rows, self.n_rows)
        size = batch_rows or self.local_rows
        mine = self._order(0)[:n][self.rank :: self.world_size]
        for i in range(0, len(mine), size):
            yield self.rows_batch(mine[i : i + size])

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed, "split": self.split,
                "batch_rows": self.batch_rows, "rows": self.n_rows}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state["step"]`; refuses a state from a different seed, batch or dataset."""
        for key, mine in (("seed", self.seed), ("split", self.split), ("batch_rows", self.batch_rows),
                          ("rows", self.n_rows)):  # fmt: skip
            if state.get(key) != mine:
                raise DataError(
                    f"cannot resume the loader exactly: saved {key}={state.get(key)!r}, now {mine!r}"
                )
        self.step = int(state["step"])
