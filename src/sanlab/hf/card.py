"""The model card (README.md) of an exported folder, in the Hub's model-card form.

YAML front matter (license, library_name, pipeline_tag, tags, datasets where the corpus is
a Hub dataset, and a model-index with the run's own zero-shot results), a usage snippet
that runs as written, then the facts. Everything comes from the run dir: the
architecture from config.json, parameters and FLOPs per token from `sanlab.accounting`
(the paper's counting convention), the data from the prepared dir's manifest, tokens,
losses, git commit and versions from meta.json, the evaluation from `eval/results-*.json`
(a full evaluation, never a `--limit` one), and the study (arm, phase, seed) from the
study's results store when the run lives in a study dir. An imported run's card takes
what its own dir lacks (corpus, losses) from the provenance the import kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sanlab import fileio
from sanlab.accounting import count_flops, count_params
from sanlab.config import format_tokens
from sanlab.eval.cli import _DEFAULT_SHOWN, _SHOWN  # the card reports what the printed table shows


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


def data_provenance(data_dir: Path | None) -> dict[str, Any]:
    """Corpus, prepare seed, split sizes and Hub dataset of a prepared dir ({} without a manifest)."""
    manifest = fileio.try_read_json_object(data_dir / "manifest.json") if data_dir is not None else None
    if manifest is None:
        return {}
    splits = manifest.get("splits", {})
    hf = (manifest.get("config") or {}).get("hf") or {}
    return {"corpus": manifest.get("corpus"), "seed": manifest.get("seed"),
            "train_tokens": splits.get("train", {}).get("tokens"), "val_tokens": splits.get("val", {}).get("tokens"),
            "tokenizer_vocab_size": manifest.get("tokenizer_vocab_size"),
            "hub_dataset": hf.get("name") if manifest.get("corpus") == "hf" else None}


def eval_results(run_path: Path, checkpoint: str) -> dict[str, Any]:
    """The run's full zero-shot results for `checkpoint` (`sanlab eval`), task -> record; a
    limited evaluation (its own file) is not a result to publish."""
    rec = fileio.try_read_json_object(run_path / "eval" / f"results-{checkpoint}.json")
    tasks = (rec or {}).get("tasks")
    if not isinstance(tasks, dict):
        return {}
    return {t: r for t, r in tasks.items() if isinstance(r, dict) and isinstance(r.get("metrics"), dict)
            and r.get("limit") is None}


def _main_metric(task: str, metrics: dict[str, Any]) -> tuple[str, float, float | None] | None:
    """(metric, value, stderr) the card reports for a task, as `sanlab eval`'s table does."""
    for m in _SHOWN.get(task, _DEFAULT_SHOWN):
        v = metrics.get(m)
        if isinstance(v, (int, float)) and v == v:
            err = metrics.get(f"{m}_stderr")
            return m, float(v), float(err) if isinstance(err, (int, float)) and err == err else None
    return None


def _front_matter(name: str, tags: list[str], data: dict[str, Any], evals: dict[str, Any]) -> list[str]:
    """The YAML block (JSON-style values: every string quoted, so no value is misread)."""
    q = json.dumps
    lines = ["---", "license: apache-2.0", "library_name: transformers", "pipeline_tag: text-generation",
             "tags:", *[f"- {q(t)}" for t in tags]]
    if data.get("hub_dataset"):
        lines += ["datasets:", f"- {q(data['hub_dataset'])}"]
    results = []
    for task, rec in evals.items():
        shown = _main_metric(task, rec["metrics"])
        if shown is not None:
            results.append(f"  - task: {{type: text-generation}}\n    dataset: {{name: {q(task)}, type: {q(task)}}}\n"
                           f"    metrics:\n    - {{type: {q(shown[0])}, value: {shown[1]!r}}}")
    if results:
        lines += ["model-index:", f"- name: {q(name)}", "  results:", *results]
    return lines + ["---"]


def model_card(src: Any, data_dir: Path, family: str | None, folder: str) -> str:
    cfg, meta = src.cfg, src.run.meta
    m = cfg.model
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}  # an imported run's origin
    params = count_params(m)
    flops = count_flops(m, cfg.data.seq_len)
    final = meta.get("final") or source.get("final") or {}
    git = meta.get("git") or {}
    study = _study(src.run.path)
    data = data_provenance(data_dir) or source.get("data") or {}
    evals = eval_results(src.run.path, src.checkpoint)
    arm = "standard (attention + SwiGLU FFN)" if m.ffn else "SAN (attention-only, no FFN)"
    mixers = ", ".join(f"{i}: {x}" for i, x in enumerate(m.layer_mixers)) if not m.is_standard else "softmax (every layer)"
    # llama and qwen3 have no √d embedding scale of their own: their input table is E·√d, the head E
    tied = family is None or family.startswith("gemma")
    remote = "" if family else ", trust_remote_code=True"
    tags = ["sanlab", "attention-only" if not m.ffn else "transformer", *([family] if family else [])]
    lines = [
        *_front_matter(src.run.name, tags, data, evals),
        f"# {src.run.name}",
        "",
        f"A {arm} trained with [sanlab](https://arxiv.org/abs/2607.18363) and exported with `sanlab export --hf`"
        + (f" as a stock `{family}` model (no remote code)." if family else
           " (modeling code in `modeling_sanlab.py`: torch and transformers only, loaded with "
           "`trust_remote_code=True`)."),
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'model = AutoModelForCausalLM.from_pretrained("{folder}"{remote})',
        f'tokenizer = AutoTokenizer.from_pretrained("{folder}"{remote})',
        'inputs = tokenizer("<|im_start|>user\\nWho", return_tensors="pt")  # BOS is added',
        "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))",
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
        f"| vocabulary | {m.vocab_size} ("
        + ("tied embedding, scaled by √d" if tied else "untied: input table E·√d, output head E") + ") |",
        f"| trained context (seq_len) | {cfg.data.seq_len} |",
        "",
        "## Size and cost",
        "",
        "Counted by `sanlab.accounting`: parameters of every tensor, forward FLOPs as 2 per "
        "multiply-accumulate including attention's score and mixing terms.",
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
    ]
    if source.get("run_id"):
        lines += [f"| imported from | run `{source['run_id']}`, checkpoint `{_fmt(source.get('checkpoint'))}` |"]
    lines += [
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
    if evals:
        lines += ["", "## Evaluation", "", f"Zero-shot, `sanlab eval` on checkpoint `{src.checkpoint}` "
                  "(lm-evaluation-harness, in process):", "", "| task | metric | value | examples |",
                  "|---|---|---|---|"]
        for task, rec in evals.items():
            shown = _main_metric(task, rec["metrics"])
            if shown is not None:
                n = (rec.get("n_samples") or {}).get("effective")
                value = f"{shown[1]:.4f}" + (f" ± {shown[2]:.4f}" if shown[2] is not None else "")
                lines += [f"| {task} | {shown[0]} | {value} | {_fmt(n)} |"]
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
        "## Limitations",
        "",
        "- A research model: small, trained briefly, for studying architectures, not for use. Its text is "
        "not reliable, and it has no safety tuning of any kind.",
        f"- It knows only its training corpus (`{_fmt(data.get('corpus'))}`; the `synth` corpus is "
        "generated facts about invented people and places, so its answers are about a world that does not exist).",
        f"- Beyond {cfg.data.seq_len} tokens of context its behaviour is untested: it never trained on longer rows.",
        "- Several documents packed in one row: pass `position_ids` restarting at 0 at each document start "
        "(and leave `use_cache` at the folder's default) so no document attends to another.",
        "",
    ]
    return "\n".join(lines)
