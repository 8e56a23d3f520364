"""`sanlab export RUN_DIR --hf OUT`: a run's checkpoint as a 🤗 transformers folder.

The folder (docs/sharing.md):

    config.json                 model_type "sanlab", auto_map to the two files below, every
                                field of the run's `model` section, the per-layer mixers
    configuration_sanlab.py     the config class     } copied from sanlab/hf/remote/: torch
    modeling_sanlab.py          the causal LM        } and transformers only, no sanlab
    model.safetensors           the weights, the tied embedding once ("model." + sanlab's names)
    generation_config.json      BOS/EOS/PAD ids, greedy by default
    tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                the run's BPE; SPEC §1.5's special ids; BOS added on encode;
                                a chat template for the SYNTH format
    README.md                   the model card (architecture, parameters and FLOPs per token
                                from sanlab.accounting, data, tokens, run id, study, losses,
                                git commit)

With `--as FAMILY` the weights are written for a stock transformers architecture instead
(`sanlab.hf.stock`): no remote code, only where the logits are those of the run.

Everything is checked before anything is written (the run dir, the checkpoint's checksums,
the weights against the config, the variant, OUT), and the folder is built beside OUT and
renamed into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sanlab.analysis.rundir import RunDir, checkpoint_name
from sanlab.config import Config
from sanlab.data.regions import BOS_ID, EOS_ID, PAD_ID
from sanlab.data.tokenizer import load_tokenizer
from sanlab.errors import CheckpointError, ConfigError, DataError
from sanlab.hf import card, stock
from sanlab.hf import tokenizer as hf_tok
from sanlab.model.lm import LM
from sanlab.model.mixers import mixer_options
from sanlab.model.mixers._stream import fixed_stream
from sanlab.paths import check_out_dir, raise_no_space, staged_dir

REMOTE_DIR = Path(__file__).parent / "remote"
REMOTE_FILES = ("configuration_sanlab.py", "modeling_sanlab.py")
EXPORTABLE_MIXERS = ("softmax", "static_emb_qk", "approximate", "non_approximate", "mlp", "mixit", "rnd_emb_qk",
                     "fixed_seq_qk")
# Q and K from a fixed sequence run through the layers (SPEC §3 RndEmbQK / FixedSeqQK): with
# the weights fixed, each such layer's input on that sequence is a constant, exported as the
# buffer `qk_stream` (seq_len, d).
STREAM_MIXERS = ("rnd_emb_qk", "fixed_seq_qk")
PREFIX = "model."  # the base model inside SanlabForCausalLM


# --------------------------------------------------------------------------- the checkpoint


@dataclass
class Source:
    """A verified checkpoint of a run, ready to convert."""

    run: RunDir
    checkpoint: str
    state: dict[str, Any]
    weights: dict[str, torch.Tensor]  # sanlab's parameter names
    layer_qk_norm: list[bool]
    mlp_hidden: int | None
    mixit: dict[str, Any] | None  # form ("matrix" | "draw"), size and options of the mixit layers

    @property
    def cfg(self) -> Config:
        return self.run.config


def expected_keys(cfg: Config, layer_qk_norm: list[bool], mixit_form: str = "matrix") -> list[str]:
    """Every tensor a checkpoint of `cfg` holds, by sanlab's names (docs/architecture.md).
    MixiT's fixed state is its matrices (`mixing`) or the draw they are built from
    (`sigma_u`, `noise`: σ_h set by the document's length), as the checkpoint has it."""
    m = cfg.model
    keys = ["embed.weight", "final_norm.weight"]
    for i, mixer in enumerate(m.layer_mixers):
        b = f"blocks.{i}."
        keys.append(b + "attn_norm.weight")
        if mixer == "mlp":
            keys += [b + f"attn.{w}.weight" for w in ("w_gate", "w_up", "w_down")]
        elif mixer == "mixit":
            keys += [b + "attn.wv.weight", b + "attn.wo.weight"]
            keys += [b + "attn.mixing"] if mixit_form == "matrix" else [b + "attn.sigma_u", b + "attn.noise"]
        else:
            keys += [b + f"attn.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
            if layer_qk_norm[i]:
                keys += [b + "attn.q_norm.weight", b + "attn.k_norm.weight"]
        if m.sandwich_norm:
            keys.append(b + "attn_post_norm.weight")
        if m.residual in ("gated", "rezero"):
            keys.append(b + "attn_gate")
        if m.ffn:
            keys += [b + "ffn_norm.weight"] + [b + f"ffn.{w}.weight" for w in ("w_gate", "w_up", "w_down")]
            if m.sandwich_norm:
                keys.append(b + "ffn_post_norm.weight")
            if m.residual in ("gated", "rezero"):
                keys.append(b + "ffn_gate")
    return keys


def check_exportable(cfg: Config) -> None:
    """A one-line ConfigError for a model the exported code cannot compute."""
    m = cfg.model
    for mixer in dict.fromkeys(m.layer_mixers):
        if mixer not in EXPORTABLE_MIXERS:
            raise ConfigError(f"model.mixer {mixer} cannot be exported (exportable: {', '.join(EXPORTABLE_MIXERS)})")
    if m.state_mixer not in ("none", "swiglu"):
        raise ConfigError(f"model.state_mixer {m.state_mixer} cannot be exported (exportable: none, swiglu)")


def open_source(run_dir: str | Path, checkpoint: str = "latest") -> Source:
    """Open a run dir and its checkpoint for export: readable, verified, and matching the
    run's config.json tensor for tensor."""
    run = RunDir.open(run_dir)
    check_exportable(run.config)
    name = checkpoint_name(checkpoint)
    ckpt = run.path / "checkpoints" / name
    if not (ckpt / "model.safetensors").is_file():
        have = ", ".join(run.checkpoints()) or "none"
        raise CheckpointError(f"{run.path}: no checkpoint {name!r} to export (available: {have})")
    state = run.verify(name)  # state.json's sha256 of the weights, as every reader checks
    try:
        weights = load_file(str(ckpt / "model.safetensors"))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{ckpt / 'model.safetensors'}: unreadable checkpoint ({e})") from None
    m = run.config.model
    qk = [f"blocks.{i}.attn.q_norm.weight" in weights for i in range(m.n_layers)]
    mixit = mixit_state(run.config, weights)
    want = expected_keys(run.config, qk, mixit["form"] if mixit else "matrix")
    # FixedSeqQK may keep its token ids as a buffer (a real held-out document)
    optional = {f"blocks.{i}.attn.tokens" for i, mx in enumerate(m.layer_mixers) if mx == "fixed_seq_qk"}
    missing = [k for k in want if k not in weights]
    extra = sorted(set(weights) - set(want) - optional)
    if missing or extra:
        what = f"has no {missing[0]}" if missing else f"holds {extra[0]}, which config.json does not explain"
        raise CheckpointError(f"{ckpt / 'model.safetensors'}: {what}")
    for k, t in LM(m).state_dict().items():  # the shapes config.json gives
        if k in weights and tuple(weights[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{ckpt / 'model.safetensors'}: {k} has shape {list(weights[k].shape)}, "
                                  f"config.json gives {list(t.shape)}")
    for i, mixer in enumerate(m.layer_mixers):
        if mixer == "softmax" and qk[i] != m.qk_norm:
            raise CheckpointError(f"{ckpt / 'model.safetensors'}: layer {i} has QK-norm {qk[i]}, "
                                  f"config.json says model.qk_norm={m.qk_norm}")
    for k, t in weights.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{ckpt / 'model.safetensors'}: {k} holds non-finite values")
    hidden = next((weights[f"blocks.{i}.attn.w_gate.weight"].shape[0] for i, mx in enumerate(m.layer_mixers)
                   if mx == "mlp"), None)
    return Source(run, name, state, weights, qk, hidden, mixit)


def stream_sources(src: Source, seq_len: int) -> dict[str, torch.Tensor]:
    """For rnd_emb_qk / fixed_seq_qk layers: their normalised input on the fixed sequence
    (what sanlab's forward computes from it on every pass; a constant once the weights are),
    positions 0 … seq_len−1, as `blocks.{i}.attn.qk_stream` (seq_len, d). The fixed pass is
    causal, so a row of T ≤ seq_len tokens reads the first T of them, as in sanlab."""
    layers = [i for i, mx in enumerate(src.cfg.model.layer_mixers) if mx in STREAM_MIXERS]
    if not layers:
        return {}
    lm = LM(src.cfg.model)
    lm.load_state_dict(src.weights, strict=True)
    with torch.no_grad():
        record = fixed_stream(lm.eval(), seq_len, torch.device("cpu"))
    return {f"blocks.{i}.attn.qk_stream": record[i][0].float().contiguous() for i in layers}


def mixit_state(cfg: Config, weights: dict[str, torch.Tensor]) -> dict[str, Any] | None:
    """How the run's mixit layers hold their fixed state, and their options (None without
    mixit layers)."""
    m = cfg.model
    layers = [i for i, mx in enumerate(m.layer_mixers) if mx == "mixit"]
    if not layers:
        return None
    b = f"blocks.{layers[0]}.attn."
    opts = mixer_options(m, "mixit").model_dump()
    if b + "mixing" in weights:
        return {"form": "matrix", "size": int(weights[b + "mixing"].shape[-1]), **opts}
    if b + "noise" in weights:
        if opts.get("sigma_length", "document") not in ("document", "prefix", "row"):
            raise ConfigError(f"mixit: sigma_length {opts.get('sigma_length')!r} cannot be exported")
        return {"form": "draw", "size": int(weights[b + "noise"].shape[-1]), **opts}
    return {"form": "matrix", "size": None, **opts}  # the key check names what is missing


# --------------------------------------------------------------------------- the folder's files


def hf_config(src: Source, seq_len: int) -> dict[str, Any]:
    """config.json of the sanlab model type: every model field, the per-layer layout, the
    trained row length, the special ids, and where it came from."""
    m = src.cfg.model
    fields = m.model_dump()
    fields.pop("ffn", None)
    return {
        "architectures": ["SanlabForCausalLM"],
        "model_type": "sanlab",
        "auto_map": {"AutoConfig": "configuration_sanlab.SanlabConfig",
                     "AutoModelForCausalLM": "modeling_sanlab.SanlabForCausalLM"},
        **fields,
        "ffn_dim": m.ffn_dim if m.ffn else 0,
        "layer_mixers": m.layer_mixers,
        "layer_qk_norm": src.layer_qk_norm,
        "mlp_hidden": src.mlp_hidden,
        "mixing_size": src.mixit["size"] if src.mixit else None,
        "mixit": src.mixit,
        "stream_tokens": next((int(t.shape[0]) for k, t in src.weights.items() if k.endswith(".attn.tokens")), None),
        "seq_len": seq_len,
        "tie_word_embeddings": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "dtype": "float32",
        "use_cache": decodes_with_cache(src),
        "sanlab": provenance(src),
    }


def decodes_with_cache(src: Source) -> bool:
    """False where a cached past would go stale: MixiT weights set by the whole document's length."""
    return not (src.mixit and src.mixit["form"] == "draw" and src.mixit.get("sigma_length") == "document")


def provenance(src: Source) -> dict[str, Any]:
    """Where the weights come from: run id, checkpoint, step, git commit, versions, the
    training data (corpus, prepare seed, tokens) and final losses. An imported run passes
    on what its import kept (`source`), so corpus and losses survive import → re-export."""
    meta = src.run.meta
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    try:
        data = card.data_provenance(src.run.data_dir())
    except DataError:
        data = {}
    return {
        "run_id": src.run.name,
        "checkpoint": src.checkpoint,
        "step": src.state.get("step"),
        "status": meta.get("status"),
        "git": meta.get("git"),
        "versions": meta.get("versions"),
        "data_dir": src.cfg.data.dir,
        "data": data or source.get("data") or {},
        "final": meta.get("final") or source.get("final") or {},
        **({"imported_from": source} if source else {}),
    }


def generation_config(use_cache: bool = True) -> dict[str, Any]:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False,
            "use_cache": use_cache}


def hf_weights(src: Source, seq_len: int) -> dict[str, torch.Tensor]:
    """model.safetensors of the sanlab model type: sanlab's names under `model.`, the tied
    embedding once (the head reads it), plus the fixed-stream layers' Q/K inputs."""
    weights = {**src.weights, **stream_sources(src, seq_len)}
    return {PREFIX + k: t.contiguous() for k, t in weights.items()}


def write_folder(tmp: Path, files: dict[str, str], weights: dict[str, torch.Tensor]) -> None:
    """Write the text files and the weights into `tmp` (a fresh directory)."""
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp / "model.safetensors", 0o666 & ~umask)  # readable as the text files are, for sharing


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def check_out(out: Path, what: str = "--hf") -> None:
    """OUT must not exist, or be an empty directory; its parent must be writable."""
    check_out_dir(out, what, whole=True)  # written whole: swapped in by staged_dir
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{what} {out}: exists and is not empty (choose a new folder)")


def export(run_dir: str | Path, out: str | Path, checkpoint: str = "latest", family: str | None = None,
           data: str | Path | None = None) -> Path:
    """Write the folder (see the module docstring); returns its path. Every input is
    checked before anything is written."""
    out = Path(out)
    check_out(out)
    src = open_source(run_dir, checkpoint)
    seq_len = src.cfg.data.seq_len
    data_dir = src.run.data_dir(data)
    tok = load_tokenizer(data_dir)
    if tok.get_vocab_size() > src.cfg.model.vocab_size:
        raise DataError(f"{data_dir}/tokenizer.json has {tok.get_vocab_size()} tokens, the model "
                        f"{src.cfg.model.vocab_size}: not the run's tokenizer")
    if family is not None:
        config, weights = stock.convert(src, family, seq_len)
        config["sanlab"] = provenance(src) | {"exported_as": family}
        files = {"config.json": dumps(config)}
    else:
        config, weights = hf_config(src, seq_len), hf_weights(src, seq_len)
        files = {"config.json": dumps(config)}
        for name in REMOTE_FILES:
            files[name] = (REMOTE_DIR / name).read_text(encoding="utf-8")
    files["generation_config.json"] = dumps(generation_config(family is not None or decodes_with_cache(src)))
    files |= hf_tok.files(tok, seq_len)
    files["README.md"] = card.model_card(src, data_dir, family, out.name)
    try:
        with staged_dir(out) as tmp:
            write_folder(tmp, files, weights)
    except (OSError, SafetensorError) as e:
        raise_no_space(e, str(out))
        raise
    return out


