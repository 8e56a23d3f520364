"""`--as FAMILY`: a run written for a stock transformers architecture (no remote code).

Offered only where the stock model computes the run's logits to fp32 rounding; anything
else is refused with one line naming the first difference. What each family computes
against sanlab's standard arm (SPEC §1.1):

| | llama | qwen3 | gemma | gemma2 | gemma3 |
|---|---|---|---|---|---|
| norm gain | w | w | 1 + w | 1 + w | 1 + w |
| per-head QK-norm before RoPE, shared over heads | no | yes | no | no | yes |
| norm on each sublayer's output (sandwich) | no | no | no | yes | yes |
| embedding × √d | no | no | yes | yes | yes |

- Norms are fp32 RMS norms with ε inside the root in every family; ZCN's (1 + γ) is written
  as w = 1 + γ (llama, qwen3) or copied as w = γ (Gemma's (1 + w)); plain RMS the other
  way round.
- The residual scalar folds into the matrix that writes into the stream: W_o ← σ(g)·W_o and
  W_down ← σ(g₂)·W_down (gated; α for rezero; standard: nothing), or, where the family has a
  sandwich norm, into its gain: (1 + w) = σ(g)·(1 + γ). Exact up to one rounding.
- The √d embedding scale: Gemma's families multiply by √d themselves (by a normaliser in
  the weights' dtype, so in bf16 it is rounded to bf16: sanlab multiplies by the fp32 value);
  llama and qwen3 get an untied input table E·√d next to the head E (`tie_word_embeddings`
  false: the embedding is stored twice).
- All families: RoPE θ rotate-half, GQA, no biases, SiLU-gated MLP.
- Not mappable: the SAN and any attention-only block (no stock family has a block without
  an MLP), `residual=none` (every family adds a residual), the SPEC §2–3 mixers, a
  sandwich norm without one in the family (or the reverse), QK-norm on/off against the
  family's. Export those with sanlab's own modeling code (no `--as`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sanlab.data.regions import BOS_ID, EOS_ID, PAD_ID
from sanlab.errors import ConfigError

FAMILIES = ("llama", "qwen3", "gemma", "gemma2", "gemma3")
# family -> (QK-norm, sandwich norm, gain is 1 + w, embedding scaled by √d inside)
TRAITS: dict[str, tuple[bool, bool, bool, bool]] = {
    "llama": (False, False, False, False),
    "qwen3": (True, False, False, False),
    "gemma": (False, False, True, True),
    "gemma2": (False, True, True, True),
    "gemma3": (True, True, True, True),
}


def mismatch(m: Any, family: str) -> str | None:
    """Why `family` does not compute model config `m` exactly, or None where it does."""
    qk, sandwich, _, _ = TRAITS[family]
    if not m.ffn:
        return "an attention-only block (the SAN) has no MLP, and every stock family's block has one"
    if not m.is_standard:
        return f"the sequence mixers ({', '.join(dict.fromkeys(m.layer_mixers))}) are not softmax attention"
    if m.state_mixer != "swiglu":
        return f"state_mixer {m.state_mixer} is not a SwiGLU MLP"
    if m.residual == "none":
        return "residual=none has no residual connection, and every stock family adds one"
    if m.qk_norm != qk:
        return (f"model.qk_norm={str(m.qk_norm).lower()}, and {family} "
                f"{'always' if qk else 'never'} normalises q and k")
    if m.sandwich_norm != sandwich:
        return (f"model.sandwich_norm={str(m.sandwich_norm).lower()}, and {family} "
                f"{'always has' if sandwich else 'has no'} a norm on each sublayer's output")
    return None


def check(m: Any, family: str) -> None:
    """A one-line ConfigError unless `family` computes model config `m` exactly."""
    why = mismatch(m, family)
    if why:
        fits = [f for f in FAMILIES if mismatch(m, f) is None]
        hint = f" (this model fits --as {' / '.join(fits)})" if fits else " (export it without --as)"
        raise ConfigError(f"--as {family}: not exact for this run: {why}{hint}")


def _gain(w: torch.Tensor, zero_centered: bool) -> torch.Tensor:
    """The factor sanlab's norm multiplies by, in fp32 (what the norm computes)."""
    w = w.float()
    return 1.0 + w if zero_centered else w


def _scale(m: Any, g: torch.Tensor | None) -> torch.Tensor:
    """The residual rule's factor on the sublayer's output."""
    if m.residual == "gated":
        return torch.sigmoid(g.float())
    if m.residual == "rezero":
        return g.float()
    return torch.ones(1)


def convert(src: Any, family: str, seq_len: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, model.safetensors tensors) of `family` for the run's checkpoint; the
    exporter (`sanlab.hf.export`, which imports this module) adds the provenance."""
    m = src.cfg.model
    check(m, family)
    qk, sandwich, plus_one, scaled = TRAITS[family]
    zc = m.norm == "zcrms"
    W = src.weights

    def norm(w: torch.Tensor, factor: torch.Tensor | None = None) -> torch.Tensor:
        gain = _gain(w, zc) * (factor if factor is not None else 1.0)
        return (gain - 1.0 if plus_one else gain).contiguous()

    out: dict[str, torch.Tensor] = {}
    E = W["embed.weight"]
    out["model.embed_tokens.weight"] = E if scaled else (E * math.sqrt(m.d_model)).contiguous()
    if not scaled:
        out["lm_head.weight"] = E.clone()
    out["model.norm.weight"] = norm(W["final_norm.weight"])
    for i in range(m.n_layers):
        b, o = f"blocks.{i}.", f"model.layers.{i}."
        s_attn = _scale(m, W.get(b + "attn_gate"))
        s_ffn = _scale(m, W.get(b + "ffn_gate"))
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
            out[o + f"self_attn.{theirs}.weight"] = W[b + f"attn.{ours}.weight"]
        out[o + "mlp.gate_proj.weight"] = W[b + "ffn.w_gate.weight"]
        out[o + "mlp.up_proj.weight"] = W[b + "ffn.w_up.weight"]
        if qk:
            out[o + "self_attn.q_norm.weight"] = norm(W[b + "attn.q_norm.weight"])
            out[o + "self_attn.k_norm.weight"] = norm(W[b + "attn.k_norm.weight"])
        out[o + "input_layernorm.weight"] = norm(W[b + "attn_norm.weight"])
        if sandwich:  # the gate folds into the output norms' gains
            out[o + "self_attn.o_proj.weight"] = W[b + "attn.wo.weight"]
            out[o + "mlp.down_proj.weight"] = W[b + "ffn.w_down.weight"]
            out[o + "post_attention_layernorm.weight"] = norm(W[b + "attn_post_norm.weight"], s_attn)
            out[o + "pre_feedforward_layernorm.weight"] = norm(W[b + "ffn_norm.weight"])
            out[o + "post_feedforward_layernorm.weight"] = norm(W[b + "ffn_post_norm.weight"], s_ffn)
        else:  # the gate folds into the matrices that write into the stream
            out[o + "self_attn.o_proj.weight"] = (W[b + "attn.wo.weight"] * s_attn).contiguous()
            out[o + "mlp.down_proj.weight"] = (W[b + "ffn.w_down.weight"] * s_ffn).contiguous()
            out[o + "post_attention_layernorm.weight"] = norm(W[b + "ffn_norm.weight"])

    config: dict[str, Any] = {
        "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.ffn_dim,
        "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads, "num_key_value_heads": m.n_kv_heads,
        "head_dim": m.head_dim, "max_position_embeddings": seq_len, "rms_norm_eps": m.norm_eps,
        # use_cache false: transformers reads restarting position_ids as packed documents (and
        # masks across them) only without a cache, and a forward builds one when this is true,
        # so `m(input_ids=x, position_ids=pos)` on a packed row would attend across documents.
        # generate() still caches: generation_config.json says use_cache true.
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": scaled, "use_cache": False,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "dtype": "float32",
        "initializer_range": m.init_std,
    }
    rope = {"rope_type": "default", "rope_theta": m.rope_theta}
    if family == "llama":
        config |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                   "mlp_bias": False, "rope_parameters": rope}
    elif family == "qwen3":
        config |= {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                   "use_sliding_window": False, "layer_types": ["full_attention"] * m.n_layers,
                   "rope_parameters": rope}
    elif family == "gemma":
        config |= {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_act": "silu",
                   "hidden_activation": "silu", "rope_parameters": rope}
    else:
        config |= {"hidden_activation": "silu", "query_pre_attn_scalar": m.head_dim,
                   "final_logit_softcapping": None, "attn_logit_softcapping": None,
                   "layer_types": ["full_attention"] * m.n_layers, "sliding_window": seq_len}
        if family == "gemma2":
            config |= {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "rope_parameters": rope}
        else:
            config |= {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                       "rope_parameters": {"full_attention": rope, "sliding_attention": dict(rope)}}
    return config, out
