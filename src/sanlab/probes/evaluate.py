"""Exact-match accuracy on the answer tokens of a probe split.

An example counts as correct when the argmax prediction at *every* answer position
equals the answer token, with the true prefix as context (teacher forcing). That is the
same as greedy decoding of the answer: if all teacher-forced predictions are right,
greedy decoding reproduces them token by token; if one is wrong, greedy decoding goes
wrong at the first such position.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sanlab.analysis.rundir import RunDir
from sanlab.data.loader import Loader


@torch.no_grad()
def accuracy(model: torch.nn.Module, data_dir: str | Path, split: str, *, bf16: bool = False,
             batch_rows: int = 32, device: str | torch.device = "cpu") -> dict[str, Any]:
    """`{"correct", "total", "accuracy"}` over every example (document) of `split`."""
    loader = Loader(data_dir, split=split, batch_rows=1, verify=False)
    n_docs = int(loader.manifest["splits"][split]["documents"])
    answer = np.zeros(n_docs, np.int64)  # answer tokens seen per example
    wrong = np.zeros(n_docs, np.int64)  # of which mispredicted
    was_training = model.training
    model.eval()
    amp = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if bf16
           else contextlib.nullcontext())
    for b in loader.eval_batches(batch_rows=batch_rows):
        with amp:
            logits = model(b["inputs"].to(device), b["segment_ids"].to(device))
        pred = logits.argmax(-1).cpu()
        mask = b["loss_mask"]
        docs = b["doc_ids"][mask].numpy()
        miss = (pred != b["targets"])[mask].numpy()
        np.add.at(answer, docs, 1)
        np.add.at(wrong, docs[miss], 1)
    model.train(was_training)
    correct = int(((answer > 0) & (wrong == 0)).sum())
    return {"correct": correct, "total": n_docs, "accuracy": correct / n_docs if n_docs else float("nan")}


def run_accuracy(run_dir: str | Path, splits: tuple[str, ...] = ("val", "test")) -> dict[str, dict[str, Any]]:
    """Accuracy of a finished probe run (its latest checkpoint) on each of `splits`."""
    run = RunDir.open(run_dir)
    model = run.load_model("latest")
    data = run.data_dir()
    bf16 = run.config.train.precision == "bf16"
    return {s: accuracy(model, data, s, bf16=bf16) for s in splits}
