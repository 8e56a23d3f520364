"""`softmax`: grouped-query softmax attention with per-head QK-norm then RoPE (SPEC §1.1),
the standard mixer, and the base of every Q/K variant."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.spec import Param, SequenceSpec, attention_terms, matrix_flops

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry


@register_mixer
class SoftmaxSpec(SequenceSpec):
    """q, k = RoPE(ZCN_h(W_q u)), RoPE(ZCN_h(W_k u)); one gain vector of size head_dim
    per q and per k, shared by all heads; A = softmax(q kᵀ/√d_h + M); out = W_o(A v)."""

    name = "softmax"
    short = "softmax"
    summary = "GQA softmax attention, QK-norm then RoPE (the default)"
    paper = "SPEC §1.1"
    has_pattern = True
    # Frozen-QK (SPEC §2) keeps everything that shapes the scores from content at init: W_q,
    # W_k and the QK-norm gains (a trainable per-dimension weighting and temperature of the
    # scores otherwise). `qk_proj` is the narrower freeze of W_q, W_k alone.
    freezable = {"qk": ("wq.weight", "wk.weight", "q_norm.weight", "k_norm.weight"),
                 "qk_proj": ("wq.weight", "wk.weight")}
    probe_freeze = {"qk": "Frozen-QK"}

    @classmethod
    def has_qk_norm(cls, cfg: ModelConfig, opts: Any) -> bool:
        """Whether q and k are normalised per head: `model.qk_norm` (a variant may decide otherwise)."""
        return cfg.qk_norm

    @classmethod
    def params(cls, cfg: ModelConfig, opts: Any) -> dict[str, Param]:
        d, H, Hkv, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        p = {
            "wq.weight": Param((H * D, d), "routing", "normal"),
            "wk.weight": Param((Hkv * D, d), "routing", "normal"),
            "wv.weight": Param((Hkv * D, d), "content", "normal"),
            "wo.weight": Param((d, H * D), "content", "out"),  # writes into the residual stream
        }
        if cls.has_qk_norm(cfg, opts):
            # One gain vector of size head_dim shared by all heads, for q and for k (SPEC §1.1).
            p["q_norm.weight"] = Param((D,), "gain", "norm")
            p["k_norm.weight"] = Param((D,), "gain", "norm")
        return p

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        mix = attention_terms(cfg, seq_len, causal_half)
        return {"attn_proj": matrix_flops(cls.params(cfg, opts)), "attn_scores": mix, "attn_mix": mix}


# ---- the module (from the first `import torch` on; the spec above loads without torch)
import torch
import torch.nn.functional as F

from sanlab.model.attention import DOCUMENT, AttentionContext, Mask, attend, fused_qkv_attention
from sanlab.model.attention.masks import decode_mask
from sanlab.model.layers import RMSNorm, apply_rope, upcast
from sanlab.model.norms import norm_rope
from sanlab.model.mixers.base import DecodeCache, DecodeStep, SequenceMixer


def rope_at(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (the formula of `sanlab.model.layers.apply_rope`) at `positions`,
    in fp32. x (B, T, H, D), positions (T,) -> (B, T, H, D)."""
    D = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    angles = positions.float()[:, None] * inv_freq  # (T, D/2)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SoftmaxKVCache(DecodeCache):
    """Softmax attention with a KV cache. Same arithmetic as the training forward:
    q, k = RoPE(ZCN_h(W u)) in fp32, GQA, softmax(q kᵀ/√D) v with the scores in fp32,
    then W_o. The new tokens attend to the cached positions and causally among
    themselves, under the mixer's mask (`attention_mask`, `masks.decode_mask`): a masked
    variant decodes through this cache unchanged."""

    def __init__(self, mixer: SoftmaxAttention, batch: int, max_len: int) -> None:
        super().__init__(mixer, batch, max_len)
        Hkv, D = mixer.n_kv_heads, mixer.head_dim
        dev = mixer.wk.weight.device
        self.k = torch.zeros(batch, Hkv, max_len, D, device=dev)  # (B, Hkv, T_max, D), fp32
        self.v = torch.zeros(batch, Hkv, max_len, D, device=dev)
        self.length = 0

    def forward(self, u: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        m = self.mixer
        B, T, _ = u.shape
        H, Hkv, D = m.n_heads, m.n_kv_heads, m.head_dim
        q = m.wq(u).view(B, T, H, D).float()
        k = m.wk(u).view(B, T, Hkv, D).float()
        v = m.wv(u).view(B, T, Hkv, D).float()
        if m.q_norm is not None:
            q, k = m.q_norm(q), m.k_norm(k)
        q, k = rope_at(q, step.positions, step.rope_theta), rope_at(k, step.positions, step.rope_theta)
        s, e = self.length, self.length + T
        self.k[:, :, s:e] = k.transpose(1, 2)
        self.v[:, :, s:e] = v.transpose(1, 2)
        self.length = e
        rep = H // Hkv
        q5 = q.transpose(1, 2).reshape(B, Hkv, rep, T, D) * D**-0.5  # (B, Hkv, rep, T, D)
        scores = q5 @ self.k[:, :, None, :e].transpose(-1, -2)  # (B, Hkv, rep, T, e)
        allowed = decode_mask(m.attention_mask(), step.positions, e)  # (T, e)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        y = (probs @ self.v[:, :, None, :e]).reshape(B, H, T, D)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, H * D).to(u.dtype)
        return m.wo(y)


class SoftmaxAttention(SequenceMixer):
    """The `softmax` mixer (`SoftmaxSpec`). A variant that computes Q and K from
    something else overrides `qk_source`; V always comes from the current hidden state."""

    spec = SoftmaxSpec
    decode_cache = SoftmaxKVCache
    # Whether the forward may run QK-norm, RoPE and attention as the one-op QKV kernel
    # (`fused_qkv_attention`) where it runs; off, always `norm_rope` then `attend` (the
    # same function in several ops, other fp32 rounding).
    one_op_qkv: ClassVar[bool] = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, opts: Any) -> None:
        super().__init__(cfg, layer_idx, opts)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        if "q_norm.weight" not in self.declared:
            self.q_norm: RMSNorm | None = None
            self.k_norm: RMSNorm | None = None

    @staticmethod
    def _norm_rope(x: torch.Tensor, norm: RMSNorm | None, ctx: AttentionContext) -> torch.Tensor:
        """Per-head QK-norm THEN RoPE, both in fp32. (B, T, h, D) -> fp32, laid out as
        (B, h, T, D) a transpose away; `attend` casts it to what its backend needs."""
        if norm is not None:
            half = x.shape[-1] // 2
            return norm_rope(x, norm.gain(torch.promote_types(x.dtype, torch.float32)), norm.eps,
                             ctx.cos[..., :half], ctx.sin[..., :half])
        return apply_rope(upcast(x), ctx.cos, ctx.sin)

    def attention_mask(self) -> Mask:
        """The keys each query sees (`masks.Mask`): every earlier key of its document. A
        masked variant overrides this alone; the forward pass, every backend and the KV
        cache read it."""
        return DOCUMENT

    def attention_masks(self) -> tuple[Mask, ...]:
        return (self.attention_mask(),)

    def qk_source(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """What Q and K are computed from: the current hidden state (the variants override this)."""
        return u

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        mask = self.attention_mask()
        src = self.qk_source(u, ctx)
        if src is u:
            # One product for Q, K and V (three parameters, so Muon still sees each matrix):
            # u is read and cast once, and dL/du is a single fp32-accumulated matmul.
            qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
            if (self.one_op_qkv and self.q_norm is not None and self.k_norm is not None
                    and self.q_norm.eps == self.k_norm.eps):
                # QK-norm, RoPE and attention from the product in one kernel where it runs
                g32 = torch.promote_types(qkv.dtype, torch.float32)
                y = fused_qkv_attention(qkv, H, Hkv, self.q_norm.gain(g32), self.k_norm.gain(g32), self.q_norm.eps,
                                        ctx, self.pattern, mask=mask)
                if y is not None:
                    return self.wo(y)
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        else:
            qk = F.linear(src, torch.cat([self.wq.weight, self.wk.weight]))
            q, k = qk.split([H * D, Hkv * D], dim=-1)
            v = self.wv(u)  # V always from the current hidden state
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        q, k = self._norm_rope(q, self.q_norm, ctx), self._norm_rope(k, self.k_norm, ctx)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), ctx, self.pattern, mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
