"""`approximate`: softmax's exp replaced by its 2nd-order Taylor expansion, causal,
normalised, in linear time (SPEC §3 Approximate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.softmax import SoftmaxSpec
from sanlab.model.mixers.spec import matrix_flops

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry


class TaylorOptions(StrictModel):
    chunk: int = Field(64, gt=0)  # query/key rows per block of the linear-time computation


@register_mixer
class TaylorSpec(SoftmaxSpec):
    """w_ij = 1 + s_ij + s_ij²/2 with s_ij = q_i·k_j/√d_h (> 0 for every s), causal and
    normalised: A_ij = w_ij / Σ_{j' ≤ i} w_ij'. Q/K as softmax attention (QK-norm, RoPE),
    and its parameters."""

    name = "approximate"
    short = "approx"
    summary = "2nd-order Taylor softmax, causal, normalised, linear time in T"
    paper = "SPEC §3"
    Options = TaylorOptions

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        """Exact for the blocked computation at row length T (`causal_half` does not apply:
        each block is computed whole). attn_block: q·kᵀ and w·v inside each block;
        attn_state: φ(q)·[S | z] for the queries of every block but the first, and the
        update φ(k)ᵀ v for the keys of every block but the last (F = 1 + d_h + d_h²)."""
        D, H, T = cfg.head_dim, cfg.n_heads, seq_len
        blocks = [min(opts.chunk, T - s) for s in range(0, T, opts.chunk)]
        feat = 1 + D + D * D
        state = (T - blocks[0]) * 2 * feat * (D + 1) + (T - blocks[-1]) * 2 * feat * D
        return {"attn_proj": matrix_flops(cls.params(cfg, opts)),
                "attn_block": 2 * 2 * D * H * sum(c * c for c in blocks) // T,
                "attn_state": H * state // T}


# ---- the module
import torch
import torch.nn.functional as F

from sanlab.model.attention import AttentionContext
from sanlab.model.layers import upcast
from sanlab.model.mixers.softmax import SoftmaxAttention


class TaylorAttention(SoftmaxAttention):
    """Linear time in T: with φ(x) = [1, x, vec(x xᵀ)/√2] and x scaled by d_h^-¼,
    w_ij = φ(q_i)·φ(k_j), so the keys before a block enter through the running sums
    S = Σ φ(k_j) v_jᵀ (F × d_h, F = 1 + d_h + d_h²) and z = Σ φ(k_j); inside a block of
    `chunk` rows the weights are computed directly. The running sums restart at every
    document start (a packed row equals each document alone). No T×T tensor is formed
    unless the pattern hook is captured (then A is materialised for analysis)."""

    spec = TaylorSpec
    decode_cache = None  # its own weights: the softmax KV cache does not apply

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k = q.view(B, T, H, D), k.view(B, T, Hkv, D)
        q, k = self._norm_rope(q, self.q_norm, ctx), self._norm_rope(k, self.k_norm, ctx)
        rep = H // Hkv
        q = q.transpose(1, 2)  # (B, H, T, D) fp32
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = upcast(v.view(B, T, Hkv, D)).transpose(1, 2).repeat_interleave(rep, dim=1)
        with torch.autocast(u.device.type, enabled=False):  # the weights and sums in fp32
            if self.pattern.active:
                A = taylor_weights(q, k, ctx.dense_mask)
                y = self.pattern(A) @ v
            else:
                y = taylor_attention(q, k, v, ctx.segment_ids, self.opts.chunk)
        return self.wo(y.to(u.dtype).transpose(1, 2).reshape(B, T, H * D))


def taylor_weights(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The explicit quadratic formula: A_ij = w_ij / Σ_j w_ij over allowed j, with
    w = 1 + s + s²/2, s = q kᵀ/√D. q, k (B, H, T, D); allowed (B, 1, T, T) -> (B, H, T, T)."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    w = (1 + s + 0.5 * s * s) * allowed
    return w / w.sum(-1, keepdim=True)


def _features(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = [1, x, vec(x xᵀ)/√2] for x already scaled by D^-¼. (…, D) -> (…, 1 + D + D²)."""
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2) * 0.5**0.5
    return torch.cat([torch.ones_like(x[..., :1]), x, outer], dim=-1)


def taylor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_ids: torch.Tensor,
                     chunk: int) -> torch.Tensor:
    """Causal, document-masked, normalised 2nd-order Taylor attention in linear time.

    q, k, v (B, H, T, D) fp32; segment_ids (B, T). Blocks of `chunk` rows: inside a block
    the weights are computed directly under the causal and document mask; keys of earlier
    blocks enter through the running sums (S, z) of the document active at the block's
    start, which restart when a document starts inside a block."""
    B, H, T, D = q.shape
    scale = D**-0.25
    qs, ks = q * scale, k * scale
    out = torch.empty_like(v)
    S = q.new_zeros(B, H, 1 + D + D * D, D)
    z = q.new_zeros(B, H, 1 + D + D * D)
    prev_seg = None  # (B,) segment id of the token before the block
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        seg = segment_ids[:, s:e]  # (B, C)
        qb, kb, vb = qs[:, :, s:e], ks[:, :, s:e], v[:, :, s:e]
        sc = qb @ kb.transpose(-1, -2)  # (B, H, C, C), = q·k/√D
        causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal  # (B, C, C)
        w = (1 + sc + 0.5 * sc * sc) * allowed[:, None]
        num, den = w @ vb, w.sum(-1)
        if prev_seg is not None:
            fq = _features(qb)  # (B, H, C, F)
            carried = (seg == prev_seg[:, None])[:, None, :]  # (B, 1, C): queries of the carried document
            num = num + (fq @ S) * carried[..., None]
            den = den + (fq @ z[..., None]).squeeze(-1) * carried
        out[:, :, s:e] = num / den[..., None]
        if e < T:
            # keys of the document active at the block's end; keep S only if it continues
            last = seg[:, -1]
            tail = (seg == last[:, None]).to(q.dtype)[:, None, :, None]  # (B, 1, C, 1)
            fk = _features(kb) * tail
            keep = (seg[:, 0] == last) & (prev_seg == last if prev_seg is not None else torch.ones_like(last, dtype=torch.bool))
            keep = keep.to(q.dtype)[:, None, None]
            S = S * keep[..., None] + fk.transpose(-1, -2) @ vb
            z = z * keep + fk.sum(-2)
            prev_seg = last
    return out
