"""A trained run ready to evaluate or sample from: model, tokenizer, row length, device.

The weights come from the run dir's checkpoint; the tokenizer is the one the run's data
was prepared with (`tokenizer.json` in the prepared dir named by `config.data.dir`, or
the dir given with `--data`). Text is encoded as in training: a literal special-token
string (`<|im_start|>`, `<think>`, …) becomes its atomic id, and every document starts
with BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from sanlab.analysis.rundir import RunDir
from sanlab.data.regions import BOS_ID
from sanlab.data.tokenizer import load_tokenizer
from sanlab.errors import CheckpointError, ConfigError


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device {device!r}: not a device (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available here")
    return dev


@dataclass
class LoadedRun:
    run: RunDir
    checkpoint: str
    model: torch.nn.Module
    tokenizer: Tokenizer
    data_dir: Path
    device: torch.device

    @property
    def seq_len(self) -> int:
        """The row length the model was trained on: the longest context it has seen."""
        return self.run.config.data.seq_len

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 autocast on CUDA (as training); fp32 on the CPU."""
        return torch.bfloat16 if self.device.type == "cuda" else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_document(self, text: str) -> list[int]:
        """BOS + text, the start of a training document."""
        return [BOS_ID] + self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def open_run(path: str | Path, checkpoint: str = "latest", data: str | Path | None = None,
             device: str = "auto") -> LoadedRun:
    run = RunDir.open(path)
    if not run.checkpoints():
        raise CheckpointError(f"{run.path}: no checkpoint with model weights yet (is it trained?)")
    dev = resolve_device(device)
    model = run.load_model(checkpoint, device=dev)
    data_dir = run.data_dir(data)
    tokenizer = load_tokenizer(data_dir)
    if tokenizer.get_vocab_size() > run.config.model.vocab_size:
        raise CheckpointError(
            f"{data_dir}/tokenizer.json has {tokenizer.get_vocab_size()} tokens but run {run.path} "
            f"has vocab_size={run.config.model.vocab_size}: not the run's tokenizer"
        )
    return LoadedRun(run, checkpoint, model, tokenizer, data_dir, dev)
