"""Fingerprints of every mixer's init and accounting, and the file that records them.

`tests/data/mixer_fingerprints.json` holds, for each configuration below, the SHA-256 of
every parameter and buffer of `LM(cfg)` built after `torch.manual_seed(0)` (names, shapes
and bytes, in order), of the parameter roles, and the parameter and FLOP counts: what a
change to the mixers must leave unchanged, bit for bit (tests/test_variants.py). These
depend only on torch's CPU random generator, not on the CPU's kernels. After a change
that is meant to move them (a new mixer, another init), rewrite the file:

    python tests/mixer_fingerprints.py > tests/data/mixer_fingerprints.json

and say why in the commit. For outputs, gradients and decoding as well, compare two trees
with scripts/mixer_fingerprint.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from sanlab.accounting import count_flops, count_params
from sanlab.config import ModelConfig
from sanlab.model.lm import LM

FILE = Path(__file__).resolve().parent / "data" / "mixer_fingerprints.json"
OPTIONS = {"mixit": {"seq_len": 24}, "approximate": {"chunk": 5}, "fixed_seq_qk": {"sequence": "random", "seq_len": 24}}
MIXERS = ("approximate", "fixed_seq_qk", "mixit", "mlp", "non_approximate", "rnd_emb_qk", "sink_window",
          "sliding_window", "softmax", "static_emb_qk")


def configs() -> dict[str, ModelConfig]:
    base = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, d_ff=48)
    out = {}
    for mixer in MIXERS:
        opts = OPTIONS.get(mixer, {})
        out[f"{mixer}/uniform/swiglu"] = ModelConfig(**base, mixer=mixer, mixer_options=opts, state_mixer="swiglu")
        out[f"{mixer}/hybrid/none"] = ModelConfig(**base, mixer=mixer, mixer_options=opts, layout="hybrid")
        out[f"{mixer}/switches"] = ModelConfig(**base, mixer=mixer, mixer_options=opts, state_mixer="swiglu",
                                               norm="rms", sandwich_norm=True, residual="rezero", qk_norm=False,
                                               scale_out_init=False)
    return out


def _digest(named: Any) -> str:
    h = hashlib.sha256()
    for name, t in named:
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def fingerprint(cfg: ModelConfig) -> dict[str, Any]:
    torch.manual_seed(0)
    model = LM(cfg)
    roles = json.dumps(model.param_roles(), sort_keys=True).encode()
    return {"init": _digest(model.named_parameters()), "buffers": _digest(model.named_buffers()),
            "roles": hashlib.sha256(roles).hexdigest()[:20], "params": count_params(cfg).breakdown,
            "flops": {str(T): count_flops(cfg, T, causal_half=T == 64).terms for T in (20, 64)}}


def all_fingerprints() -> dict[str, Any]:
    return {name: fingerprint(cfg) for name, cfg in configs().items()}


if __name__ == "__main__":
    json.dump(all_fingerprints(), sys.stdout, indent=1, sort_keys=True)
    print()
