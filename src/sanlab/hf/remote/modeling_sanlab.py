"""A sanlab language model for 🤗 transformers (`sanlab export --hf`).

Imports torch and transformers only: load it with

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

The architecture (arXiv 2607.18363 §1.1 and the variants of arXiv 2506.01115 and
2510.11602), as sanlab trains it:

    x   = E[tokens] · √d                                  tied embedding, scaled
    per block (pre-norm; the SAN has no FFN):
        u = N(x);  x = R(x, [N'](mixer(u)), g)            R: the residual rule, N': sandwich norm
        u = N(x);  x = R(x, [N'](W_down(SiLU(W_gate u) ⊙ W_up u)), g₂)     (standard arm only)
    logits = N_final(x) Eᵀ

    N(z) = (1 + γ) ⊙ z / √(mean(z²) + ε) in fp32 (`norm: zcrms`), or γ ⊙ z / … (`rms`)
    R: gated x + σ(g)·h | rezero x + g·h | standard x + h | none h
    softmax mixer: q, k = RoPE(N_h(W_q u)), RoPE(N_h(W_k u)) (per-head norm THEN rotate-half
    RoPE, θ = rope_theta; one gain of size head_dim shared by all heads), grouped-query
    softmax(q kᵀ/√d_h + mask) v, then W_o.

Sequence mixers (`config.layer_mixers`, one per layer): `softmax`; `static_emb_qk` (q and k
from the scaled input embedding RMS-normalised without a gain, v from the block's input);
`approximate` (exp replaced by 1 + s + s²/2, normalised); `non_approximate` (weights
softmax over keys j ≤ i of q_j·k_j/√d_h with q = SiLU(W_q u), no RoPE); `mlp` (a gated MLP,
no mixing across tokens); `mixit` (fixed random causal matrices, or the draw they are
built from, as buffers; see `MixiT`); `rnd_emb_qk`, `fixed_seq_qk` (q and k from the
layer's input on a fixed sequence, the buffer `qk_stream`; v from the block's input).

Inputs follow transformers' conventions: `attention_mask` (2-D, 1 = token, 0 = padding;
left padding for generation), `inputs_embeds` (rows of `get_input_embeddings()`, scaled by
√d inside as the rows `input_ids` pick are), `position_ids` (default: from the mask, so a left-padded row gets
positions 0, 1, … from its first token, as sanlab's documents do); position ids that
restart (a difference other than 1 between neighbours) start a new document, which
attention never crosses, as in sanlab's packed rows. `labels` are shifted inside (or
`shift_labels` given already shifted; -100 is ignored). A KV cache (transformers' `Cache`)
holds what each mixer needs: keys and values (softmax, static_emb_qk, approximate), the
per-position score and values (non_approximate), the positions and values (mixit).
Attention runs through `torch.nn.functional.scaled_dot_product_attention`; with
`output_attentions=True` the weights are computed explicitly and returned for the layers
whose mixer has a pattern (None for `mlp`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_sanlab import SanlabConfig

# The input of static_emb_qk's Q and K is normalised with this epsilon, whatever norm_eps is.
STATIC_QK_EPS = 1e-6


# --------------------------------------------------------------------------- parts


class SanlabNorm(nn.Module):
    """RMS norm in fp32: (1 + γ) ⊙ z / √(mean(z²) + ε) (zero-centred gain, γ stored), or γ ⊙ … ."""

    def __init__(self, dim, eps, zero_centered):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        gain = self.weight.float()
        if self.zero_centered:
            gain = 1.0 + gain
        return (x32 * (x32.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * gain).to(x.dtype)


def rope(x, cos, sin):
    """Rotate-half RoPE in fp32. x (B, H, T, D); cos, sin (B, 1, T, D/2)."""
    x = x.float()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_tables(positions, head_dim, theta):
    """cos, sin (B, 1, T, D/2) at integer positions (B, T)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    return angles.cos()[:, None], angles.sin()[:, None]


def repeat_heads(x, rep):
    """(B, Hkv, T, D) -> (B, Hkv·rep, T, D), each KV head serving `rep` query heads."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def masked_softmax(scores, allowed):
    """Softmax over the allowed keys; a row with none allowed gives zeros (never NaN)."""
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    return torch.nan_to_num(probs, nan=0.0)


def sdpa(q, k, v, allowed, scale):
    """SDPA with a boolean mask (True = may attend). Rows that may attend to nothing
    (padding queries) may attend to every key instead, so the kernel stays finite; no real
    token ever reads their output."""
    empty = ~allowed.any(-1, keepdim=True)
    if bool(empty.any()):
        allowed = allowed | empty
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)


class Step:
    """What every layer of one forward pass shares: positions, RoPE tables, the mask."""

    def __init__(self, config, positions, allowed, embedded, output_attentions, lengths=None):
        self.positions = positions  # (B, Tq) position of each new token within its sequence
        self.lengths = lengths  # (B, Tq) tokens in each new token's sequence (no cache only)
        self.cos, self.sin = rope_tables(positions, config.head_dim, config.rope_theta)
        self.allowed = allowed  # (B, 1, Tq, Tk) bool over the cached and the new keys
        self.embedded = embedded  # (B, Tq, d) the scaled input embedding
        self.output_attentions = output_attentions
        self._static = None

    def static_qk_input(self):
        if self._static is None:
            x = self.embedded.float()
            self._static = (x * (x.pow(2).mean(-1, keepdim=True) + STATIC_QK_EPS).rsqrt()).to(self.embedded.dtype)
        return self._static


def cache_update(cache, layer_idx, keys, values):
    if cache is None:
        return keys, values
    return cache.update(keys, values, layer_idx)


# --------------------------------------------------------------------------- sequence mixers


class SoftmaxAttention(nn.Module):
    has_pattern = True

    def __init__(self, config, layer_idx):
        super().__init__()
        d, H, Hkv, D = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        self.layer_idx, self.n_heads, self.n_kv_heads, self.head_dim = layer_idx, H, Hkv, D
        self.wq = nn.Linear(d, H * D, bias=False)
        self.wk = nn.Linear(d, Hkv * D, bias=False)
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        if config.layer_qk_norm[layer_idx]:
            self.q_norm = SanlabNorm(D, config.norm_eps, config.norm == "zcrms")
            self.k_norm = SanlabNorm(D, config.norm_eps, config.norm == "zcrms")
        else:
            self.q_norm = self.k_norm = None

    def qk_source(self, u, step):
        return u

    def project(self, u, step):
        """q (B, H, T, D) and k (B, Hkv, T, D) after the per-head norm and RoPE, in u's
        dtype; v (B, Hkv, T, D)."""
        B, T, _ = u.shape
        src = self.qk_source(u, step)
        q = self.wq(src).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(src).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(u).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q.float()), self.k_norm(k.float())
        q, k = rope(q, step.cos, step.sin), rope(k, step.cos, step.sin)
        return q.to(u.dtype), k.to(u.dtype), v

    def weights(self, q, k, allowed):
        """(B, H, Tq, Tk) mixing weights, computed explicitly."""
        s = q.float() @ k.float().transpose(-1, -2) * self.head_dim**-0.5
        return masked_softmax(s, allowed)

    def forward(self, u, step, cache):
        B, T, _ = u.shape
        q, k, v = self.project(u, step)
        k, v = cache_update(cache, self.layer_idx, k, v)
        rep = self.n_heads // self.n_kv_heads
        k, v = repeat_heads(k, rep), repeat_heads(v, rep)
        pattern = None
        if step.output_attentions:
            pattern = self.weights(q, k, step.allowed)
            y = (pattern @ v.float()).to(u.dtype)
        else:
            y = sdpa(q, k, v, step.allowed, self.head_dim**-0.5)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1)), pattern


class StaticEmbQK(SoftmaxAttention):
    """Q and K from the static input embedding (scaled, RMS-normalised without a gain)."""

    def qk_source(self, u, step):
        return step.static_qk_input().to(u.dtype)


class StreamQK(SoftmaxAttention):
    """rnd_emb_qk / fixed_seq_qk: Q and K from this layer's input on a fixed sequence (random
    embeddings, or a real held-out document) run through the blocks, read at each token's
    position; V from the block's input. With the weights fixed that input is a constant, the
    buffer `qk_stream` (seq_len, d), written by the export."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.register_buffer("qk_stream", torch.zeros(config.seq_len, config.d_model))
        if config.layer_mixers[layer_idx] == "fixed_seq_qk" and config.stream_tokens:
            self.register_buffer("tokens", torch.zeros(config.stream_tokens, dtype=torch.long))  # kept, not read

    def qk_source(self, u, step):
        n = self.qk_stream.shape[0]
        if int(step.positions.max()) >= n:
            raise ValueError(f"{self.__class__.__name__}: position {int(step.positions.max())} is past the "
                             f"{n} positions of its fixed sequence")
        return self.qk_stream[step.positions].to(u.dtype)  # (B, T, d)


class TaylorAttention(SoftmaxAttention):
    """exp replaced by its 2nd-order Taylor expansion: w = 1 + s + s²/2 (> 0), normalised
    over the allowed keys; q and k as softmax attention's. Computed in fp32."""

    def weights(self, q, k, allowed):
        s = q.float() @ k.float().transpose(-1, -2) * self.head_dim**-0.5
        w = (1 + s + 0.5 * s * s) * allowed
        return w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)

    def forward(self, u, step, cache):
        B, T, _ = u.shape
        q, k, v = self.project(u, step)
        k, v = cache_update(cache, self.layer_idx, k, v)
        rep = self.n_heads // self.n_kv_heads
        A = self.weights(q, repeat_heads(k, rep), step.allowed)
        y = (A @ repeat_heads(v, rep).float()).to(u.dtype)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1)), A if step.output_attentions else None


class NonApproximate(SoftmaxAttention):
    """No pairwise similarity: A_ij = softmax over allowed j of s_j = q_j·k_j/√d_h, with
    q = SiLU(W_q u), k = W_k u (per-head norm where the layer has it, no RoPE). The cache
    holds s (B, H, T, 1) and v."""

    def forward(self, u, step, cache):
        B, T, _ = u.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = F.silu(self.wq(u).float()).view(B, T, H, D)
        k = self.wk(u).float().view(B, T, Hkv, D)
        v = self.wv(u).view(B, T, Hkv, D).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rep = H // Hkv
        s = (q * k.repeat_interleave(rep, dim=2)).sum(-1) * D**-0.5  # (B, T, H)
        s = s.transpose(1, 2)[..., None]  # (B, H, T, 1)
        s, v = cache_update(cache, self.layer_idx, s, v)
        v = repeat_heads(v, rep)
        if step.output_attentions:
            A = masked_softmax(s.transpose(-1, -2).expand(B, H, T, s.shape[2]), step.allowed)
            y = (A @ v.float()).to(u.dtype)
        else:
            A = None
            ones = s.new_ones(B, H, T, 1)
            y = sdpa(ones, s, v.float(), step.allowed, 1.0).to(u.dtype)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * D)), A


class MixiT(nn.Module):
    """Fixed random causal mixing, out = W_o(A v), over the allowed keys (p: positions within
    the sequence). Two forms, as the checkpoint holds them (`config.mixit["form"]`):

    - "matrix": A[h, i, j] = mixing[h, p_i, p_j] (the buffer `mixing`, (H, n, n));
    - "draw": A[h, i, j] = δ(p_i, p_j) + σ_h(T_i)·noise[h, p_i, p_j] with
      σ_h(T) = 1/√(T·d_h) + sigma_u[h]·(1/√T − 1/√(T·d_h)) and T_i the length of query i's
      sequence (`sigma_length` "document"), p_i + 1 ("prefix") or `seq_len` ("row"); with
      `sink_head`, head 0 is ½ on the diagonal plus ½ on the sequence's first token.

    The cache holds the keys' positions (B, 1, T, 1) and v. Where the weights depend on the
    whole sequence's length ("document"), a cached past would be stale: such a model
    decodes with full forward passes (`use_cache=False`) and refuses a cache."""

    has_pattern = True

    def __init__(self, config, layer_idx):
        super().__init__()
        d, H, Hkv, D = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        self.layer_idx, self.n_heads, self.n_kv_heads, self.head_dim = layer_idx, H, Hkv, D
        self.wv = nn.Linear(d, Hkv * D, bias=False)
        self.wo = nn.Linear(H * D, d, bias=False)
        opts = dict(getattr(config, "mixit", None) or {})
        self.form = opts.get("form", "matrix")
        n = int(opts.get("size") or config.mixing_size or config.seq_len)
        if self.form == "matrix":
            self.register_buffer("mixing", torch.zeros(H, n, n))
        else:
            self.sigma_length = opts.get("sigma_length", "document")
            self.sink_head = bool(opts.get("sink_head", True))
            self.row_length = int(opts.get("seq_len", n))
            self.register_buffer("sigma_u", torch.zeros(H))
            self.register_buffer("noise", torch.zeros(H, n, n))

    @property
    def needs_whole_sequence(self):
        return self.form == "draw" and self.sigma_length == "document"

    def _weights(self, pq, pk, step):
        """(B, H, Tq, Tk) mixing weights before the mask."""
        if self.form == "matrix":
            return self.mixing[:, pq[:, :, None], pk[:, None, :]].transpose(0, 1)
        if self.sigma_length == "document":
            T = step.lengths.clamp_min(1).to(self.noise.dtype)  # (B, Tq); a padding query counts 0 tokens
        elif self.sigma_length == "prefix":
            T = (pq + 1).to(self.noise.dtype)
        else:
            T = torch.full(pq.shape, float(self.row_length), dtype=self.noise.dtype, device=pq.device)
        low = (T * self.head_dim) ** -0.5  # (B, Tq)
        sigma = low[:, None] + self.sigma_u[None, :, None] * (T[:, None] ** -0.5 - low[:, None])  # (B, H, Tq)
        eye = (pq[:, :, None] == pk[:, None, :]).to(self.noise.dtype)[:, None]  # (B, 1, Tq, Tk)
        A = eye + sigma[..., None] * self.noise[:, pq[:, :, None], pk[:, None, :]].transpose(0, 1)
        if self.sink_head:
            first = (pk == 0).to(A.dtype)[:, None, :].expand(-1, pq.shape[1], -1)  # (B, Tq, Tk)
            A = torch.cat([(0.5 * eye[:, 0] + 0.5 * first)[:, None], A[:, 1:]], dim=1)
        return A

    def forward(self, u, step, cache):
        B, T, _ = u.shape
        n = (self.mixing if self.form == "matrix" else self.noise).shape[-1]
        if int(step.positions.max()) >= n:
            raise ValueError(f"mixit: position {int(step.positions.max())} is past its {n}x{n} mixing matrices")
        if self.needs_whole_sequence and cache is not None:
            raise ValueError("mixit with sigma_length=document mixes by the whole sequence's length, so a KV "
                             "cache would go stale: call with use_cache=False (generate(..., use_cache=False))")
        v = self.wv(u).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        pos = step.positions.clamp_min(0).to(v.dtype)[:, None, :, None]  # (B, 1, T, 1)
        pos_k, v = cache_update(cache, self.layer_idx, pos, v)
        pq, pk = step.positions.clamp_min(0), pos_k[:, 0, :, 0].long()  # (B, Tq), (B, Tk)
        A = self._weights(pq, pk, step) * step.allowed
        y = A.to(v.dtype) @ repeat_heads(v, self.n_heads // self.n_kv_heads)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1)), A if step.output_attentions else None


class GatedMLP(nn.Module):
    """W_down(SiLU(W_gate x) ⊙ W_up x), no biases."""

    def __init__(self, d, hidden):
        super().__init__()
        self.w_gate = nn.Linear(d, hidden, bias=False)
        self.w_up = nn.Linear(d, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class MLPMixer(GatedMLP):
    """A token-local gated MLP in place of attention (no pattern)."""

    has_pattern = False

    def __init__(self, config, layer_idx):
        super().__init__(config.d_model, config.mlp_hidden)
        self.layer_idx = layer_idx

    def forward(self, u, step, cache):
        B, T, _ = u.shape
        empty = u.new_zeros(B, 1, T, 0)  # nothing to keep; the cache still counts the tokens
        cache_update(cache, self.layer_idx, empty, empty)
        return super().forward(u), None


MIXERS = {
    "softmax": SoftmaxAttention,
    "static_emb_qk": StaticEmbQK,
    "approximate": TaylorAttention,
    "non_approximate": NonApproximate,
    "mlp": MLPMixer,
    "mixit": MixiT,
    "rnd_emb_qk": StreamQK,
    "fixed_seq_qk": StreamQK,
}


# --------------------------------------------------------------------------- blocks and model


class SanlabBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        d, zc = config.d_model, config.norm == "zcrms"
        self.residual = config.residual
        scalar = config.residual in ("gated", "rezero")
        self.attn_norm = SanlabNorm(d, config.norm_eps, zc)
        self.attn = MIXERS[config.layer_mixers[layer_idx]](config, layer_idx)
        self.attn_post_norm = SanlabNorm(d, config.norm_eps, zc) if config.sandwich_norm else None
        self.attn_gate = nn.Parameter(torch.zeros(1)) if scalar else None
        if config.state_mixer != "none":
            self.ffn_norm = SanlabNorm(d, config.norm_eps, zc)
            self.ffn = GatedMLP(d, config.ffn_dim)
            self.ffn_post_norm = SanlabNorm(d, config.norm_eps, zc) if config.sandwich_norm else None
            self.ffn_gate = nn.Parameter(torch.zeros(1)) if scalar else None
        else:
            self.ffn = None

    def _residual(self, x, h, g):
        if self.residual == "gated":
            return x + torch.sigmoid(g.float()).to(h.dtype) * h
        if self.residual == "rezero":
            return x + g.to(h.dtype) * h
        if self.residual == "standard":
            return x + h
        return h

    def forward(self, x, step, cache):
        h, pattern = self.attn(self.attn_norm(x), step, cache)
        if self.attn_post_norm is not None:
            h = self.attn_post_norm(h)
        x = self._residual(x, h, self.attn_gate)
        if self.ffn is not None:
            h = self.ffn(self.ffn_norm(x))
            if self.ffn_post_norm is not None:
                h = self.ffn_post_norm(h)
            x = self._residual(x, h, self.ffn_gate)
        return x, pattern


class SanlabPreTrainedModel(PreTrainedModel):
    config_class = SanlabConfig
    base_model_prefix = "model"
    _no_split_modules = ["SanlabBlock"]
    _supports_sdpa = True
    _supports_cache_class = True

    def _init_weights(self, module):
        # Exported weights are always complete; this only gives fresh modules a sane start.
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, SanlabNorm):
            nn.init.constant_(module.weight, 0.0 if module.zero_centered else 1.0)


def _sequence_starts(position_ids):
    """(B, T) segment ids: a new document starts wherever the position does not grow by 1."""
    step = position_ids[:, 1:] - position_ids[:, :-1]
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = step != 1
    return starts.long().cumsum(-1)


class SanlabModel(SanlabPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(SanlabBlock(config, i) for i in range(config.n_layers))
        self.final_norm = SanlabNorm(config.d_model, config.norm_eps, config.norm == "zcrms")
        self.embed_scale = math.sqrt(config.d_model)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if output_attentions is None:
            output_attentions = bool(getattr(self.config, "output_attentions", False))
        if output_hidden_states is None:
            output_hidden_states = bool(getattr(self.config, "output_hidden_states", False))
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True))
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        x = x * self.embed_scale  # (B, T, d)
        B, T = x.shape[:2]
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        total = past + T
        device = x.device
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError("attention_mask must be 2-D (batch, tokens): 1 for a token, 0 for padding")
            valid = attention_mask.to(device=device, dtype=torch.bool)[:, -total:]  # (B, past + T)
            if valid.shape[1] != total:
                raise ValueError(f"attention_mask covers {valid.shape[1]} tokens, the cache and input {total}")
        else:
            valid = torch.ones(B, total, dtype=torch.bool, device=device)
        if position_ids is None:
            # positions within each sequence, counted from its first token (left padding)
            position_ids = (valid.long().cumsum(-1) - 1).clamp_min(0)[:, past:]
        position_ids = position_ids.to(device).expand(B, T)
        q_idx = torch.arange(past, total, device=device)
        allowed = (torch.arange(total, device=device)[None, :] <= q_idx[:, None])[None]  # (1, T, total) causal
        allowed = allowed & valid[:, None, :]
        lengths = None
        if past == 0:  # restarting positions separate documents, as sanlab's packed rows
            seg = _sequence_starts(position_ids)
            same = (seg[:, :, None] == seg[:, None, :]) & valid[:, None, :]  # (B, T, T)
            allowed = allowed & same
            lengths = same.sum(-1)  # the real tokens of each token's sequence
        step = Step(self.config, position_ids, allowed[:, None], x, output_attentions, lengths)

        hidden = (x,) if output_hidden_states else None
        patterns = () if output_attentions else None
        for block in self.blocks:
            x, pattern = block(x, step, cache)
            if output_hidden_states:
                hidden += (x,)
            if output_attentions:
                patterns += (pattern,)
        x = self.final_norm(x)
        if output_hidden_states:  # as transformers' models: the last entry after the final norm
            hidden = hidden[:-1] + (x,)
        return BaseModelOutputWithPast(last_hidden_state=x, hidden_states=hidden, attentions=patterns,
                                       **{_CACHE_FIELD: cache if use_cache else None})


_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


class SanlabForCausalLM(SanlabPreTrainedModel, GenerationMixin):
    """The LM: SanlabModel, then the tied head (logits = N_final(x) Eᵀ)."""

    def __init__(self, config):
        super().__init__(config)
        self.model = SanlabModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                logits_to_keep=0, shift_labels=None, past_key_values=None, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            h = h[:, logits_to_keep]
        logits = F.linear(h, self.model.embed.weight)  # tied head, (B, T, V)
        loss = None
        if labels is not None or shift_labels is not None:
            if shift_labels is None:
                shift_labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
            flat = logits.float().reshape(-1, logits.shape[-1])
            targets = shift_labels.to(logits.device).reshape(-1)
            n_items = kwargs.get("num_items_in_batch")
            if n_items is not None:
                loss = F.cross_entropy(flat, targets, ignore_index=-100, reduction="sum") / n_items
            else:
                loss = F.cross_entropy(flat, targets, ignore_index=-100)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions, **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)})
        return result if return_dict is not False else result.to_tuple()
