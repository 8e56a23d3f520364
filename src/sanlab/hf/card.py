"""The model card (README.md) of an exported folder.

Everything in it comes from the run dir: the architecture from config.json, parameters
and FLOPs per token from `sanlab.accounting` (the paper's counting convention, SPEC §1.2),
the data from the prepared dir's manifest, tokens, losses, git commit and versions from
meta.json, and the study (arm, phase, seed) from the study's results store when the run
lives in a study dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sanlab import fileio
from sanlab.accounting import count_flops, count_params
from sanlab.config import format_tokens


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or "—"
    return str(v)


def _study(run_path: Path) -> dict[str, Any] | None:
    """The study record of a run inside a study dir (`STUDY/runs/RUN_ID`), or None."""
    root = run_path.resolve().parent.parent
    if run_path.resolve().parent.name != "runs" or not (root / "study.json").is_file():
        return None
    found: dict[str, Any] = {"dir": root.name}
    spec = fileio.try_read_json_object(root / "study.json")
    if spec is not None:
        found["name"] = spec.get("name")
    store = root / "results.jsonl"
    if store.is_file():
        for _, _, rec in fileio.read_jsonl(store):
            if rec is not None and rec.get("run_id") == run_path.resolve().name:
                found |= {k: rec.get(k) for k in ("arm", "phases", "optimizer", "lr", "seed", "tokens")}
    return found


def _data(data_dir: Path) -> dict[str, Any]:
    manifest = fileio.try_read_json_object(data_dir / "manifest.json")
    if manifest is None:
        return {}
    splits = manifest.get("splits", {})
    return {"corpus": manifest.get("corpus"), "seed": manifest.get("seed"),
            "train_tokens": splits.get("train", {}).get("tokens"), "val_tokens": splits.get("val", {}).get("tokens"),
            "tokenizer_vocab_size": manifest.get("tokenizer_vocab_size")}


def model_card(src: Any, data_dir: Path, family: str | None, folder: str) -> str:
    cfg, meta = src.cfg, src.run.meta
    m = cfg.model
    params = count_params(m)
    flops = count_flops(m, cfg.data.seq_len)
    final = meta.get("final") or {}
    git = meta.get("git") or {}
    study = _study(src.run.path)
    data = _data(data_dir)
    arm = "standard (attention + SwiGLU FFN)" if m.ffn else "SAN (attention-only, no FFN)"
    mixers = ", ".join(f"{i}: {x}" for i, x in enumerate(m.layer_mixers)) if not m.is_standard else "softmax (every layer)"
    load = (f'AutoModelForCausalLM.from_pretrained("{folder}")' if family else
            f'AutoModelForCausalLM.from_pretrained("{folder}", trust_remote_code=True)')
    lines = [
        "---",
        "library_name: transformers",
        "tags: [sanlab, attention-only]" if not m.ffn else "tags: [sanlab]",
        "---",
        f"# {src.run.name}",
        "",
        f"A {arm} trained with [sanlab](https://arxiv.org/abs/2607.18363) and exported with `sanlab export --hf`"
        + (f" as a stock `{family}` model (no remote code)." if family else
           " (modeling code in `modeling_sanlab.py`: torch and transformers only)."),
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = {load}",
        f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
        "```",
        "",
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        f"| layers × width | {m.n_layers} × {m.d_model} |",
        f"| heads (query / key-value), head dim | {m.n_heads} / {m.n_kv_heads}, {m.head_dim} |",
        f"| sequence mixer per layer | {mixers} |",
        f"| state mixer (FFN) | {m.state_mixer}" + (f", d_ff {m.ffn_dim}" if m.ffn else "") + " |",
        f"| norm | {m.norm} (eps {m.norm_eps}), QK-norm {m.qk_norm}, sandwich norm {m.sandwich_norm} |",
        f"| residual | {m.residual} |",
        f"| RoPE θ | {m.rope_theta:g} (rotate-half) |",
        f"| vocabulary | {m.vocab_size} (tied embedding, scaled by √d) |",
        f"| trained context (seq_len) | {cfg.data.seq_len} |",
        "",
        "## Size and cost (sanlab.accounting, SPEC §1.2 convention)",
        "",
        "| | |",
        "|---|---|",
        f"| parameters, total | {params.total:,} |",
        f"| parameters, non-embedding | {params.non_embedding:,} |",
        f"| forward FLOPs per token at T={cfg.data.seq_len} | {flops.forward:,} |",
        f"| training FLOPs per token (3× forward) | {flops.train:,} |",
        "",
        "FLOPs by term (forward, per token): " + ", ".join(f"{k} {v:,}" for k, v in flops.terms.items()) + ".",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| run id | `{src.run.name}` |",
        f"| checkpoint | `{src.checkpoint}` (step {_fmt(src.state.get('step'))}) |",
        f"| status | {_fmt(meta.get('status'))} |",
        f"| tokens trained | {format_tokens(final['tokens']) if isinstance(final.get('tokens'), int) else '—'} |",
        f"| optimizer | {cfg.optim.name}, lr {cfg.optim.lr:g} |",
        f"| precision | {cfg.train.precision} |",
        f"| validation loss (nats/token) | {_fmt(final.get('val_loss'))} |",
        f"| train loss (nats/token) | {_fmt(final.get('train_loss'))} |",
        f"| git commit | `{git.get('commit') or 'unknown'}`" + (" (dirty)" if git.get("dirty") else "") + " |",
        f"| sanlab / torch | {(meta.get('versions') or {}).get('sanlab', '—')} / "
        f"{(meta.get('versions') or {}).get('torch', '—')} |",
    ]
    if study:
        lines += [f"| study | {study.get('name') or study['dir']}: arm {_fmt(study.get('arm'))}, phases "
                  f"{_fmt(study.get('phases'))}, seed {_fmt(study.get('seed'))} |"]
    regions = {k[len("val_loss_"):]: v for k, v in final.items() if k.startswith("val_loss_")}
    if regions:
        lines += ["", "Validation loss by region: " + ", ".join(f"{k} {_fmt(v)}" for k, v in regions.items()) + "."]
    lines += [
        "",
        "## Data",
        "",
        f"Corpus `{_fmt(data.get('corpus'))}` (prepare seed {_fmt(data.get('seed'))}): "
        f"{_fmt(data.get('train_tokens'))} training and {_fmt(data.get('val_tokens'))} validation tokens, "
        f"a byte-level BPE of {_fmt(data.get('tokenizer_vocab_size'))} tokens. "
        "Documents are `[BOS] text [EOS]`; the tokenizer adds BOS when encoding. Special ids: "
        "PAD 0, EOS 1, BOS 2, UNK 3, `<|im_start|>` 4, `<|im_end|>` 5, `<think>` 6, `</think>` 7; "
        "the chat template writes the SYNTH format "
        "(`<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n<think>\\n…\\n</think>\\n…<|im_end|>`).",
        "",
        f"The model saw at most {cfg.data.seq_len} tokens of context in training "
        "(`max_position_embeddings`); attention never crossed a document.",
        "",
    ]
    return "\n".join(lines)
