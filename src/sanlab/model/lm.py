"""The language model: embed (× √d) → blocks → final norm → tied head (SPEC §1.1)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import ModelConfig
from sanlab.model.blocks import Block
from sanlab.model.layers import HookPoint, build_context, make_norm


class LM(nn.Module):
    """Decoder-only LM. `cfg.ffn=False` is the SAN; `cfg.ffn=True` the standard arm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg, cfg.d_model)
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

    def forward(self, tokens: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, segment_ids: (B, T) -> logits (B, T, V).

        Tokens with different segment ids never attend to each other and RoPE
        positions restart at every document start, so a packed row gives each
        document exactly the logits it would get alone.
        """
        ctx = build_context(self.cfg, tokens, segment_ids)
        x = self.embed(tokens) * self.embed_scale  # (B, T, d)
        for block in self.blocks:
            x = block(x, ctx)
        x = self.final(self.final_norm(x))
        return F.linear(x, self.embed.weight)  # tied head, (B, T, V)


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy in fp32. (B, T, V), (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


def _loss_chunk_rows(logits: torch.Tensor) -> int:
    """Rows per chunk of the loss. On the CPU ~512K logits (2 MB in fp32), so every pass
    over a chunk stays in cache; on accelerators ~128M (512 MB), which bounds the fp32
    temporaries (a 16×2048-token micro-batch at V=16,384 would otherwise need 2 GB)
    while keeping the number of kernel launches small."""
    budget = 1 << 19 if logits.device.type == "cpu" else 1 << 27
    return max(1, budget // logits.shape[1])


class _CrossEntropyZLoss(torch.autograd.Function):
    """Σ_i w_i·CE_i and Σ_i w_i·lse_i² over the logits, with a hand-written backward.

    Autograd through logsumexp + gather streams several (N, V) fp32 temporaries
    through memory; here each chunk of rows is upcast, reduced and (in the backward)
    turned into its softmax gradient while it is in cache.
    d/dx [w(lse − x_t) + c·w·lse²] = w·p·(1 + 2c·lse) − w·onehot(t), with p = softmax(x).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):  # type: ignore[override]
        dt = torch.promote_types(logits.dtype, torch.float32)  # at least fp32
        lse = torch.empty(logits.shape[0], dtype=dt, device=logits.device)  # (N,)
        step = _loss_chunk_rows(logits)
        for i in range(0, logits.shape[0], step):
            lse[i : i + step] = torch.logsumexp(logits[i : i + step].to(dt), dim=-1)
        target_logit = logits.gather(-1, targets[:, None]).squeeze(-1).to(dt)
        ctx.save_for_backward(logits, targets, weights, lse)
        return ((lse - target_logit) * weights).sum(), (lse.square() * weights).sum()

    @staticmethod
    def backward(ctx, g_ce: torch.Tensor, g_z: torch.Tensor):  # type: ignore[override]
        logits, targets, weights, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        coef = weights * (g_ce + 2.0 * g_z * lse)  # (N,)
        step = _loss_chunk_rows(logits)
        for i in range(0, logits.shape[0], step):
            j = slice(i, i + step)
            p = torch.sub(logits[j].to(lse.dtype), lse[j, None]).exp_()  # softmax of the chunk
            p.mul_(coef[j, None])
            p.scatter_add_(-1, targets[j, None], (-weights[j] * g_ce)[:, None])
            grad[j] = p
        return grad, None, None


def lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, z_loss: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean CE over `loss_mask` tokens plus z_loss · logsumexp(logits)² (SPEC §1.1).

    logits (B, T, V), targets (B, T), loss_mask (B, T) bool. Returns (loss to
    optimise, cross-entropy alone). Targets outside the mask (document boundaries,
    padding) contribute nothing.
    """
    V = logits.shape[-1]
    mask = loss_mask.reshape(-1).to(torch.promote_types(logits.dtype, torch.float32))
    weights = mask / mask.sum().clamp_min(1.0)
    ce, z = _CrossEntropyZLoss.apply(logits.reshape(-1, V), targets.reshape(-1), weights)
    return ce + z_loss * z, ce
