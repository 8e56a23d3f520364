"""Configuration of a sanlab language model exported for 🤗 transformers.

Written by `sanlab export --hf`; imports transformers only. The fields keep sanlab's names
(`d_model`, `n_layers`, …, the run's `model` section), the usual transformers names read
the same values (`hidden_size` is `d_model`, `max_position_embeddings` the row length the
model was trained on), and two per-layer lists say what each block holds:

    layer_mixers    the sequence mixer of each layer ("softmax", "static_emb_qk",
                    "approximate", "non_approximate", "mlp", "mixit", "rnd_emb_qk",
                    "fixed_seq_qk")
    layer_qk_norm   whether that layer normalises q and k per head (a gain of size
                    head_dim shared by all heads, for q and for k)
"""

from transformers import PretrainedConfig

EXPORTABLE_MIXERS = ("softmax", "static_emb_qk", "approximate", "non_approximate", "mlp", "mixit", "rnd_emb_qk",
                     "fixed_seq_qk")


class SanlabConfig(PretrainedConfig):
    model_type = "sanlab"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "max_position_embeddings": "seq_len",
        "rms_norm_eps": "norm_eps",
        "intermediate_size": "ffn_dim",
    }

    def __init__(
        self,
        vocab_size=2048,
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        state_mixer="none",
        d_ff=None,
        ffn_dim=0,
        residual="gated",
        norm="zcrms",
        qk_norm=True,
        sandwich_norm=False,
        rope_theta=10000.0,
        norm_eps=1e-6,
        init_std=0.02,
        scale_out_init=True,
        mixer="softmax",
        mixer_options=None,
        layout="uniform",
        attn_backend="auto",
        layer_mixers=None,
        layer_qk_norm=None,
        mlp_hidden=None,
        mixing_size=None,
        mixit=None,
        stream_tokens=None,
        seq_len=256,
        tie_word_embeddings=True,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.state_mixer = state_mixer
        self.d_ff = d_ff
        self.ffn_dim = ffn_dim
        self.residual = residual
        self.norm = norm
        self.qk_norm = qk_norm
        self.sandwich_norm = sandwich_norm
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps
        self.init_std = init_std
        self.scale_out_init = scale_out_init
        self.mixer = mixer
        self.mixer_options = dict(mixer_options or {})
        self.layout = layout
        self.attn_backend = attn_backend
        self.layer_mixers = list(layer_mixers) if layer_mixers is not None else ["softmax"] * n_layers
        self.layer_qk_norm = list(layer_qk_norm) if layer_qk_norm is not None else [bool(qk_norm)] * n_layers
        self.mlp_hidden = mlp_hidden  # the hidden width of the `mlp` sequence mixer, where a layer has it
        self.mixing_size = mixing_size  # the side of the mixit layers' matrices, where a layer has them
        self.mixit = dict(mixit or {})  # their form and options (modeling_sanlab.MixiT)
        self.stream_tokens = stream_tokens  # fixed_seq_qk's token ids, where its checkpoint holds them
        self.seq_len = seq_len
        self.use_cache = use_cache
        unknown = sorted(set(self.layer_mixers) - set(EXPORTABLE_MIXERS))
        if unknown:
            raise ValueError(f"sanlab: unknown sequence mixer {unknown[0]!r} (known: {', '.join(EXPORTABLE_MIXERS)})")
        if len(self.layer_mixers) != n_layers or len(self.layer_qk_norm) != n_layers:
            raise ValueError(f"sanlab: layer_mixers and layer_qk_norm must list n_layers={n_layers} layers")
        super().__init__(
            tie_word_embeddings=tie_word_embeddings,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            bos_token_id=bos_token_id,
            **kwargs,
        )

    @property
    def head_dim(self):
        return self.d_model // self.n_heads
