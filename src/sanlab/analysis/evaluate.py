"""One pass of a model over the fixed evaluation sample feeds every per-token measurement.

The sample is a fixed set of held-out rows (same rows, same order for every run), so
per-token losses of two runs pair up exactly. During the pass, forward hooks on the
model's stable hook points reduce attention patterns and residual-stream states to
running sums immediately: memory holds one layer's activations at a time, which is
what lets a deep model or a long row be analysed in batches on a GPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from sanlab.analysis.attention import AttentionCollector
from sanlab.analysis.losses import TokenTable
from sanlab.analysis.metrics import segment_positions
from sanlab.analysis.output import MIN_GROUP_TOKENS
from sanlab.analysis.stream import StreamCollector, stream_hooks
from sanlab.data.loader import Loader
from sanlab.data.regions import PAD_ID, REGION_NAMES
from sanlab.data.shards import open_split
from sanlab.errors import DataError
from sanlab.model.hooks import hook_names
from sanlab.model.lm import token_losses

# Token frequencies for the frequency buckets are counted on at most this many training
# tokens: ranks of all but the rarest tokens are stable long before, and it keeps the
# count under a second on any corpus size.
MAX_COUNT_TOKENS = 1 << 25


@dataclass(frozen=True)
class EvalSample:
    """Held-out rows, all (R, T) on the CPU, plus per-token exercise-type indices.

    `token_counts` (V,) counts token ids over the training split, for frequency buckets.
    """

    inputs: Tensor
    targets: Tensor
    segment_ids: Tensor
    region_ids: Tensor
    loss_mask: Tensor
    exercise: Tensor
    exercise_names: tuple[str, ...]
    token_counts: Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.inputs.shape[0])

    def token_table(self) -> TokenTable:
        """Attributes of the loss-masked target tokens, flattened row-major."""
        m = self.loss_mask.bool()
        pos, _ = segment_positions(self.segment_ids)  # (R, T)
        return TokenTable(
            region=self.region_ids[m],
            exercise=self.exercise[m],
            position=pos[m],
            token=self.targets[m],
            exercise_names=self.exercise_names,
        )


def load_sample(data_dir: str | Path, rows: int) -> EvalSample:
    """The first `rows` rows of the validation split's fixed order (the rows the trainer
    evaluates on), with per-token exercise types and training-split token counts."""
    import numpy as np

    loader = Loader(data_dir, split="val", batch_rows=1, verify=False)
    batches = list(loader.eval_batches(rows, batch_rows=rows))
    if not batches:
        raise DataError(f"{data_dir}: the validation split has no rows")
    b = batches[0]
    doc_ex = torch.from_numpy(loader.doc_exercise)  # (documents,)
    exercise = doc_ex[b["doc_ids"].clamp_min(0)]  # (R, T); PAD targets are masked out anyway
    counts = None
    if "train" in loader.manifest["splits"]:
        counts = np.zeros(loader.vocab_size, np.int64)
        budget = MAX_COUNT_TOKENS
        for shard in open_split(data_dir, loader.manifest, "train"):
            toks = shard["tokens"]
            take = min(len(toks), max(budget // toks.shape[1], 0))
            if take == 0:
                break
            counts += np.bincount(np.asarray(toks[:take]).reshape(-1), minlength=loader.vocab_size)[: loader.vocab_size]
            budget -= take * toks.shape[1]
    return EvalSample(
        inputs=b["inputs"],
        targets=b["targets"],
        segment_ids=b["segment_ids"],
        region_ids=b["region_ids"],
        loss_mask=b["loss_mask"],
        exercise=exercise,
        exercise_names=tuple(loader.exercise_names),
        token_counts=torch.from_numpy(counts) if counts is not None else None,
    )


MAX_AUTO_ROWS = 1024


def rows_for_groups(data_dir: str | Path, min_tokens: int = MIN_GROUP_TOKENS,
                    max_rows: int = MAX_AUTO_ROWS) -> tuple[int, dict[str, int]]:
    """The fewest rows of the validation split's fixed order (the analysis sample is a
    prefix of it) in which every region and exercise type that occurs in the first
    `max_rows` rows has at least `min_tokens` scored tokens; all of those rows when some
    group never gets there. Returns (rows, {group: its scored tokens} for the groups that
    stay short, empty when none does)."""
    import numpy as np

    loader = Loader(data_dir, split="val", batch_rows=1, verify=False)
    n = min(max_rows, loader.n_rows)
    if n == 0:
        raise DataError(f"{data_dir}: the validation split has no rows")
    b = next(loader.eval_batches(n, batch_rows=n))
    mask = b["loss_mask"].numpy()  # (R, T)
    ex = np.asarray(loader.doc_exercise)[b["doc_ids"].clamp_min(0).numpy()]
    names = [f"region {r}" for r in REGION_NAMES] + [f"exercise {e}" for e in loader.exercise_names]
    per_row = np.stack([
        *((mask & (b["region_ids"].numpy() == i)).sum(1) for i in range(len(REGION_NAMES))),
        *((mask & (ex == i)).sum(1) for i in range(len(loader.exercise_names))),
    ], axis=1)  # (R, groups)
    cum = per_row.cumsum(0)
    present = cum[-1] > 0
    ok = (cum[:, present] >= min_tokens).all(1)
    if ok.any():
        return int(np.argmax(ok)) + 1, {}
    return n, {names[g]: int(cum[-1, g]) for g in np.flatnonzero(present & (cum[-1] < min_tokens))}


@dataclass
class EvalResult:
    """Per-token losses (N,) over the loss-masked targets, and the collectors' rows."""

    losses: Tensor
    attention: dict[str, list[dict]] | None
    stream: list[dict] | None


@contextmanager
def _reducers(model: nn.Module, fns: dict[str, Callable[[Tensor], None]]) -> Iterator[None]:
    """Call fns[name](output) each time hook point `name` fires, without keeping the tensor.

    Names the model lacks (a mixer variant without an attention pattern) are skipped.
    """
    present = set(hook_names(model))
    handles = [
        model.get_submodule(name).register_forward_hook(lambda _m, _i, out, fn=fn: fn(out.detach()))
        for name, fn in fns.items()
        if name in present
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    sample: EvalSample,
    *,
    batch_rows: int = 4,
    device: str | torch.device = "cpu",
    attention: bool = True,
    stream: bool = True,
    normalize_attention: bool = False,
) -> EvalResult:
    """Run `model` over `sample` in batches of `batch_rows`; fp32 throughout.

    Attention and stream statistics use every real (non-PAD) input position; losses
    use the loss-masked targets, in the order of `sample.token_table()`.
    """
    cfg = model.cfg  # type: ignore[attr-defined]
    n_layers = cfg.n_layers
    att = AttentionCollector(n_layers) if attention else None
    st = StreamCollector(stream_hooks(n_layers), cfg.d_model) if stream else None
    losses: list[Tensor] = []
    model = model.to(device).eval()
    for lo in range(0, sample.rows, batch_rows):
        sl = slice(lo, lo + batch_rows)
        inputs = sample.inputs[sl].to(device)
        seg = sample.segment_ids[sl].to(device)
        real = inputs != PAD_ID  # (B, T)
        fns: dict[str, Callable[[Tensor], None]] = {}
        if att is not None:
            for i in range(n_layers):
                fns[f"blocks.{i}.attn.pattern"] = lambda a, i=i: att.add(i, a, seg, real)
        if st is not None:
            for name in st.names:
                fns[name] = lambda x, name=name: st.add(name, x, real)
        with _reducers(model, fns):
            logits = model(inputs, seg)  # (B, T, V)
        tl = token_losses(logits, sample.targets[sl].to(device))  # (B, T)
        losses.append(tl[sample.loss_mask[sl].to(device).bool()].to("cpu", torch.float64))
    return EvalResult(
        losses=torch.cat(losses) if losses else torch.zeros(0, dtype=torch.float64),
        attention=att.results(normalize_attention) if att is not None else None,
        stream=st.results() if st is not None else None,
    )
