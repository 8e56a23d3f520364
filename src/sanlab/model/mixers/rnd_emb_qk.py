"""`rnd_emb_qk`: Q and K from fixed random embeddings passed through the layers (SPEC §3 RndEmbQK)."""

from __future__ import annotations

from sanlab.model.mixers import register_mixer
from sanlab.model.mixers._stream import StreamQKSpec


@register_mixer
class RndEmbQKSpec(StreamQKSpec):
    """The fixed sequence is random embeddings, N(0, init_std)·√d like the initial token
    embeddings, drawn from `seed` (input-independent Q/K maps)."""

    name = "rnd_emb_qk"
    short = "rndqk"
    summary = "Q/K from fixed random embeddings passed through the layers"
    paper = "SPEC §3"


# ---- the module
import torch
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.mixers._stream import StreamQK


class RndEmbQK(StreamQK):
    spec = RndEmbQKSpec

    def fixed_input(self, embed: nn.Embedding, scale: float, T: int, cfg: ModelConfig,
                    device: torch.device) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.opts.seed)
        x = torch.randn(1, T, cfg.d_model, generator=g) * (cfg.init_std * scale)
        return x.to(device=device, dtype=embed.weight.dtype)
