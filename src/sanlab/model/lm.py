"""The language model: embed (× √d) → blocks → final norm → tied head (SPEC §1.1)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.blocks import Block
from sanlab.model.kernels import head_loss, lm_loss  # noqa: F401 - lm_loss is part of this module's interface
from sanlab.model.layers import HookPoint, build_context, make_norm


class LM(nn.Module):
    """Decoder-only LM. `cfg.ffn=False` is the SAN; `cfg.ffn=True` the standard arm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg, cfg.d_model, feeds_matmul=True)
        self.final = HookPoint()
        self.embed_scale = math.sqrt(cfg.d_model)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """SPEC §1.1 init: N(0, s) for input-side matrices and the embedding;
        N(0, s / √(2L)) for matrices that write into the residual stream (W_o, W_down)."""
        s = self.cfg.init_std
        out_std = s / math.sqrt(2 * self.cfg.n_layers) if self.cfg.scale_out_init else s
        out_ids = {id(p) for b in self.blocks for p in b.output_weights()}
        for name, p in self.named_parameters():
            if p.ndim == 2:
                nn.init.normal_(p, 0.0, out_std if id(p) in out_ids else s)
            elif name.endswith("_gate"):
                p.zero_()
            elif name.endswith("norm.weight"):
                p.fill_(0.0 if self.cfg.norm == "zcrms" else 1.0)

    def forward(
        self,
        tokens: torch.Tensor,
        segment_ids: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        z_loss: float = 1e-4,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens, segment_ids: (B, T) -> logits (B, T, V); with `targets` (B, T) the
        training loss instead: (loss to optimise, cross-entropy alone), as `lm_loss`,
        from the fused head + loss (`head_loss`) that never materialises the logits.

        Tokens with different segment ids never attend to each other and RoPE
        positions restart at every document start, so a packed row gives each
        document exactly the logits it would get alone.
        """
        ctx = build_context(self.cfg, tokens, segment_ids)
        x = self.embed(tokens) * self.embed_scale  # (B, T, d)
        for block in self.blocks:
            x = block(x, ctx)
        x = self.final(self.final_norm(x))
        if targets is not None:
            if loss_mask is None:
                loss_mask = torch.ones_like(targets, dtype=torch.bool)
            return head_loss(x, self.embed.weight, targets, loss_mask, z_loss)
        return F.linear(x, self.embed.weight)  # tied head, (B, T, V)


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy in fp32. (B, T, V), (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


