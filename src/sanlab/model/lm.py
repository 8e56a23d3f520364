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


def _loss_chunk_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    """Rows per chunk of the fused head + loss. On the CPU ~2M logits (8 MB in fp32): the
    passes over a chunk stay in the last-level cache, and the head's matmuls are large
    enough to run near peak (at V=2048, 1024-row chunks were ~5% faster than 256-row
    ones on a 2-core CPU). On accelerators ~128M (512 MB), which bounds the fp32
    temporaries (a 16×2048-token micro-batch at V=16,384 would otherwise need 2 GB)
    while keeping the number of kernel launches small."""
    budget = 1 << 21 if device.type == "cpu" else 1 << 27
    return max(1, min(n_rows, budget // vocab))


class _HeadCrossEntropyZLoss(torch.autograd.Function):
    """Σ_i w_i·(CE_i + c·lse_i²) over logits = x Wᵀ, chunk by chunk, gradients included.

    Autograd through head → logsumexp → gather streams the (N, V) logits and several
    fp32 temporaries of that size through memory. Here each chunk of rows is projected,
    reduced and turned into its gradient while it is in cache, and only dx (N, d) and
    dW (V, d) are kept for the backward, which scales them by the incoming gradient:
    d/dlogits [w(lse − x_t) + c·w·lse²] = w·p·(1 + 2c·lse) − w·onehot(t), p = softmax.
    The matmuls run in x's dtype (bf16 under autocast, as the unfused head's), every
    reduction in at least fp32. Returns (loss, cross-entropy), the second not differentiable.
    """

    @staticmethod
    def forward(ctx, x, weight, targets, weights, c, grad_enabled):  # type: ignore[override]
        dt = torch.promote_types(x.dtype, torch.float32)
        w_x = weight.to(x.dtype)
        # (grad mode is off inside forward: the caller says whether a backward can follow)
        grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        N, V = x.shape[0], weight.shape[0]
        ce = torch.zeros((), dtype=dt, device=x.device)
        z = torch.zeros((), dtype=dt, device=x.device)
        if grad:
            dx = torch.empty_like(x)
            dw = torch.zeros(weight.shape, dtype=dt, device=x.device)
        step = _loss_chunk_rows(N, V, x.device)
        for i in range(0, N, step):
            j = slice(i, i + step)
            logits = (x[j] @ w_x.t()).to(dt)  # (n, V)
            # log_softmax is one fused pass per row (logsumexp on the CPU is ~2x slower);
            # lse = x_t − log p_t, exact in fp32.
            t, w = targets[j, None], weights[j]
            logp = torch.log_softmax(logits, dim=-1)
            logp_t = logp.gather(-1, t).squeeze(-1)
            lse = logits.gather(-1, t).squeeze(-1) - logp_t
            del logits
            ce -= (logp_t * w).sum()
            z += (lse.square() * w).sum()
            if grad:
                # w(1 + 2c·lse)·(p − onehot/(1 + 2c·lse)): the target's subtraction in fp32
                # (it cancels when p_t ≈ 1), then one pass that scales and casts
                scale = 1.0 + 2.0 * c * lse
                p = logp.exp_().scatter_add_(-1, t, -(1.0 / scale)[:, None])
                g = torch.mul(p, (w * scale)[:, None], out=torch.empty(p.shape, dtype=x.dtype, device=x.device))
                dx[j] = g @ w_x
                dw += g.t() @ x[j]
        if grad:
            ctx.save_for_backward(dx, dw)
        ctx.mark_non_differentiable(ce)
        return ce + c * z, ce

    @staticmethod
    def backward(ctx, g_loss, g_ce):  # type: ignore[override]
        dx, dw = ctx.saved_tensors
        return dx * g_loss.to(dx.dtype), dw * g_loss, None, None, None, None


def head_loss(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, z_loss: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """`lm_loss(x @ weightᵀ, targets, loss_mask, z_loss)` without the logits.

    x (B, T, d) final hidden states, weight (V, d) the (tied) head. Under autocast the
    head matmul runs in the autocast dtype, as `F.linear` would.
    """
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    mask = loss_mask.reshape(-1).to(torch.promote_types(x.dtype, torch.float32))
    weights = mask / mask.sum().clamp_min(1.0)
    with torch.autocast(dev, enabled=False):
        return _HeadCrossEntropyZLoss.apply(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1), weights, z_loss,
                                            torch.is_grad_enabled())


def lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, z_loss: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean CE over `loss_mask` tokens plus z_loss · logsumexp(logits)² (SPEC §1.1).

    logits (B, T, V), targets (B, T), loss_mask (B, T) bool. Returns (loss to
    optimise, cross-entropy alone). Targets outside the mask (document boundaries,
    padding) contribute nothing. Training uses the fused `head_loss` (through
    `LM.forward(..., targets=...)`); this is the same loss for logits already at hand.
    """
    logits32 = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    mask = loss_mask.reshape(-1).to(logits32.dtype)
    weights = mask / mask.sum().clamp_min(1.0)
    flat = logits32.reshape(-1, logits32.shape[-1])
    lse = torch.logsumexp(flat, dim=-1)
    ce = ((lse - flat.gather(-1, targets.reshape(-1, 1)).squeeze(-1)) * weights).sum()
    return ce + z_loss * (lse.square() * weights).sum(), ce
