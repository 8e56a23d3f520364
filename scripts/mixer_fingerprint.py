#!/usr/bin/env python3
"""Fingerprints of every registered mixer: what a refactor of the mixers must leave unchanged.

For each sequence mixer (uniform and hybrid, with and without the SwiGLU state mixer, and
a few architecture switches), from the same seed: the SHA-256 of every parameter and
buffer at init, of the logits of a packed batch (fp32, and bf16 autocast), of the
training loss and every gradient, of greedy decoding (and whether it used a cache), the
parameter roles, the freeze targets' names, and the parameter and FLOP counts. Two runs
of the same tree print the same JSON; compare a run before a change with one after:

    python scripts/mixer_fingerprint.py > before.json   # on the old tree
    python scripts/mixer_fingerprint.py > after.json
    python scripts/mixer_fingerprint.py --compare before.json after.json

Only public interfaces are used (`LM`, `count_params`, `count_flops`, `Decoder`, the
registry's names), so the script runs on the tree before and after such a change.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch

from sanlab.accounting import count_flops, count_params
from sanlab.cliargs import ArgumentParser, script_main
from sanlab.config import ModelConfig
from sanlab.fileio import read_json_object
from sanlab.model import mixers
from sanlab.model.generate import Decoder
from sanlab.model.lm import LM

OPTIONS = {"mixit": {"seq_len": 24}, "approximate": {"chunk": 5},
           "fixed_seq_qk": {"sequence": "random", "seq_len": 24}}
SWITCHES: dict[str, dict[str, Any]] = {
    "base": {},
    "rms-sandwich-rezero": {"norm": "rms", "sandwich_norm": True, "residual": "rezero"},
    "no-qk-norm-standard": {"qk_norm": False, "residual": "standard", "scale_out_init": False},
}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


def configs() -> dict[str, ModelConfig]:
    out = {}
    for mixer in sorted(mixers.MIXERS):
        for layout in ("uniform", "hybrid"):
            for state in ("none", "swiglu"):
                for sw, extra in SWITCHES.items():
                    if sw != "base" and (layout, state) != ("uniform", "swiglu"):
                        continue
                    kw = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, d_ff=48,
                              mixer=mixer, state_mixer=state, layout=layout, mixer_options=OPTIONS.get(mixer, {}))
                    kw.update(extra)
                    out[f"{mixer}/{layout}/{state}/{sw}"] = ModelConfig(**kw)
    return out


def fingerprint(cfg: ModelConfig) -> dict[str, Any]:
    torch.manual_seed(0)
    model = LM(cfg)
    out: dict[str, Any] = {
        "params": {n: digest(p) for n, p in model.named_parameters()},
        "buffers": {n: digest(b) for n, b in model.named_buffers()},
        "roles": model.param_roles(),
    }
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # gates and gains off their init, so every parameter matters
        for p in model.parameters():
            if p.ndim < 2:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    tokens = torch.randint(0, cfg.vocab_size, (2, 20), generator=g)
    seg = torch.tensor([[0] * 7 + [1] * 13, [0] * 20])
    model.eval()
    with torch.no_grad():
        out["logits"] = digest(model(tokens, seg))
        out["logits_single"] = digest(model(tokens))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out["logits_bf16"] = digest(model(tokens, seg).float())
    model.train()
    loss, ce = model(tokens, seg, targets=tokens.roll(-1, 1))
    loss.backward()
    out["loss"] = [float(loss.detach()), float(ce.detach())]
    out["grads"] = {n: digest(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.eval()
    dec = Decoder(model, max_len=16)
    logits = dec.prefill(tokens[:1, :5])
    toks = []
    for _ in range(6):
        nxt = logits.argmax(-1)
        toks.append(int(nxt))
        logits = dec.append(nxt.view(1, 1))
    out["decode"] = {"cached": dec.cached, "note": dec.note, "tokens": toks, "last": digest(logits)}
    out["params_count"] = count_params(cfg).to_dict()
    out["flops"] = {f"{T}/{half}": count_flops(cfg, T, causal_half=half).to_dict()
                    for T in (20, 2048) for half in (False, True)}
    frozen = {}
    for target in ("qk", "qk_proj", "mlp"):
        torch.manual_seed(0)
        try:
            frozen[target] = LM(cfg).freeze([target])
        except Exception as e:  # noqa: BLE001 - the message is part of the fingerprint
            frozen[target] = f"{type(e).__name__}: {e}"
    out["freeze"] = frozen
    return out


def compare(a: dict, b: dict, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        diffs = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                diffs.append(f"{path}{k}: only in {'after' if k not in a else 'before'}")
            else:
                diffs += compare(a[k], b[k], f"{path}{k}.")
        return diffs
    return [] if a == b else [f"{path[:-1]}: {a!r} -> {b!r}"]


def main() -> int:
    ap = ArgumentParser(prog="mixer_fingerprint.py", description=__doc__.splitlines()[0])
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        before, after = (read_json_object(p) for p in args.compare)
        diffs = compare(before, after)
        print("\n".join(diffs) if diffs else f"identical: {len(before)} configurations")
        return 1 if diffs else 0
    torch.set_num_threads(1)
    json.dump({name: fingerprint(cfg) for name, cfg in configs().items()}, sys.stdout, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
