"""`fixed_seq_qk`: Q and K from one fixed real token sequence passed through the layers
(SPEC §3 FixedSeqQK)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers._stream import StreamQKSpec


class FixedSeqOptions(StrictModel):
    # data: the first held-out tokens of data.dir (real text, SPEC §3; the trainer binds them);
    # random: token ids drawn from `seed` uniformly over the non-special ids (8 … vocab−1)
    sequence: Literal["data", "random"] = "data"
    seed: int = 0  # the draw of sequence="random"
    seq_len: int = Field(256, gt=0)  # tokens the fixed sequence holds: the longest row it serves


@register_mixer
class FixedSeqQKSpec(StreamQKSpec):
    """The fixed sequence is one real token sequence, embedded by the model's own
    (trained) embedding: the first `seq_len` tokens of the held-out split of `data.dir`,
    i.e. its first document ([BOS] … [EOS]), cut at `seq_len` when longer and followed by
    the next held-out documents when shorter, passed through the layers as one sequence.
    A row of T tokens reads its first T."""

    name = "fixed_seq_qk"
    short = "fixedqk"
    summary = ("Q/K from one fixed real token sequence (the first held-out tokens of `data.dir`) "
               "passed through the layers")
    paper = "SPEC §3"
    Options = FixedSeqOptions


# ---- the module
from typing import Any, Callable

import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.errors import ConfigError, DataError
from sanlab.model.mixers._stream import StreamQK

UNSET = -1  # a token id of FixedSeqQK's sequence not taken from data (yet)


class FixedSeqQK(StreamQK):
    """The ids are a persistent buffer (`tokens`, saved in checkpoints, never trained). A model
    built without data holds no sequence (every id `UNSET`): accounting, matching and
    building work, a forward pass is an error until `bind_data` (the trainer, from
    `data.dir`) or a checkpoint fills it. `sequence="random"` draws the ids from `seed`
    instead (the construction before real data was used)."""

    spec = FixedSeqQKSpec

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        if opts.sequence == "random":
            g = torch.Generator().manual_seed(opts.seed)
            low = 8 if cfg.vocab_size > 8 else 0
            tokens = torch.randint(low, cfg.vocab_size, (opts.seq_len,), generator=g)
        else:
            tokens = torch.full((opts.seq_len,), UNSET, dtype=torch.long)
        self.register_buffer("tokens", tokens)

    def bind_data(self, heldout: Callable[[int], torch.Tensor], seq_len: int) -> None:
        if seq_len > self.opts.seq_len:
            raise ConfigError(f"fixed_seq_qk: rows of {seq_len} tokens, but its fixed sequence holds "
                              f"model.mixer_options.seq_len={self.opts.seq_len}")
        if self.opts.sequence != "data":
            return
        ids = heldout(self.opts.seq_len).to(self.tokens)
        if len(ids) < seq_len:
            raise DataError(f"fixed_seq_qk: the held-out split holds {len(ids)} tokens, fewer than the "
                            f"rows of {seq_len} its fixed sequence must cover")
        self.tokens.fill_(UNSET)
        self.tokens[: len(ids)] = ids

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        tokens = self.tokens[:T]
        if T > len(self.tokens) or bool((tokens == UNSET).any()):
            have = int((self.tokens != UNSET).sum())
            if have == 0:
                raise ConfigError("fixed_seq_qk: no fixed sequence (a model built without data: training "
                                  "binds it from data.dir's held-out split, a checkpoint restores it; "
                                  "model.mixer_options.sequence=random draws ids instead)")
            raise ConfigError(f"fixed_seq_qk: rows of {T} tokens, but its fixed sequence holds {have}")
        return embed(tokens[None].to(device)) * scale
