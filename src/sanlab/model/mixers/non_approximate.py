"""`non_approximate`: a running softmax average of v over the document, no pairwise
similarity (SPEC §3 Non-approximate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sanlab.configbase import StrictModel
from sanlab.model.mixers import register_mixer
from sanlab.model.mixers.softmax import SoftmaxSpec
from sanlab.model.mixers.spec import attention_terms, matrix_flops

if TYPE_CHECKING:
    from sanlab.config import ModelConfig  # annotations only: sanlab.config imports the registry


class NonApproximateOptions(StrictModel):
    # Per-head QK-norm of SiLU(q) and k. Off by default: SPEC §3's scores are unbounded (the
    # paper's model has no QK-norm); `model.qk_norm` does not decide it for this mixer.
    qk_norm: bool = False


@register_mixer
class NonApproximateSpec(SoftmaxSpec):
    """q = SiLU(W_q u), k = W_k u (no RoPE: a score of one position has no relative
    offset), and A_ij = softmax_{j ≤ i}(q_j · k_j / √d_h): each key's weight is
    independent of the query position, so row i is a running softmax average of v over
    the document so far. No QK-norm unless `mixer_options.qk_norm` turns it on (then
    SiLU(q) and k are normalised per head, with gains, before the score). Same parameters
    as softmax attention (the q/k gains only with its QK-norm)."""

    name = "non_approximate"
    short = "nonapprox"
    summary = "A_ij = softmax_{j≤i}(q_j·k_j/√d_h), q = SiLU(W_q u), no QK-norm"
    paper = "SPEC §3"
    Options = NonApproximateOptions

    @classmethod
    def has_qk_norm(cls, cfg: ModelConfig, opts: Any) -> bool:
        return opts.qk_norm

    @classmethod
    def flops(cls, cfg: ModelConfig, opts: Any, seq_len: int, causal_half: bool) -> dict[str, int]:
        """The products that run: projections, the kernel's score product (a d_h-wide head,
        so the same count as softmax attention's q·kᵀ) and A·v. The per-position score
        q_j·k_j is elementwise (2·H·d_h) and, like norms, not counted."""
        mix = attention_terms(cfg, seq_len, causal_half)
        return {"attn_proj": matrix_flops(cls.params(cfg, opts)), "attn_scores": mix, "attn_mix": mix}


# ---- the module
import torch
import torch.nn.functional as F

from sanlab.model.attention import AttentionContext, attend
from sanlab.model.layers import upcast
from sanlab.model.mixers.softmax import SoftmaxAttention


class NonApproximate(SoftmaxAttention):
    """Computed by the attention kernels with a query e₀ and a key s_j·√d_h·e₀ (heads as
    wide as V's, so every backend takes them), so document masking and the pattern hook
    are those of softmax attention."""

    spec = NonApproximateSpec
    decode_cache = None  # its own scores: the softmax KV cache does not apply

    def forward(self, u: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = F.linear(u, torch.cat([self.wq.weight, self.wk.weight, self.wv.weight]))
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = F.silu(upcast(q)).view(B, T, H, D)
        k = upcast(k).view(B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm.normalize(q), self.k_norm.normalize(k)
        rep = H // Hkv
        # s_j = q_j · k_j / √d_h per query head (the KV head of its group)
        s = torch.linalg.vecdot(q, k.repeat_interleave(rep, dim=2)) * D**-0.5  # (B, T, H)
        qq = s.new_zeros(B, H, T, D)
        qq[..., 0] = 1.0
        kk = s.new_zeros(B, H, T, D)
        kk[..., 0] = s.transpose(1, 2) * D**0.5  # the kernel divides by √D
        vv = v.view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(rep, dim=1)  # (B, H, T, D)
        y = attend(qq, kk, vv, ctx, self.pattern)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
