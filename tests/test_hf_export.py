"""`sanlab export --hf`: the exported folder, loaded by 🤗 transformers with its own modeling
code, computes what sanlab computes, for every covered configuration: logits (one document
per row, and padded batches with an attention mask), attention patterns and hidden states,
greedy generation with and without the KV cache, and the validation loss on packed rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hf_helpers import SEQ_LEN, load_hf, load_sanlab, make_run

transformers = pytest.importorskip("transformers")

from sanlab.cli import main  # noqa: E402
from sanlab.model.hooks import capture  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)

# SPEC §1.1's switches on both arms, every exportable SPEC §2–3 mixer, hybrid layouts.
CONFIGS: dict[str, dict] = {
    "san": {},
    "standard": {"ffn": True},
    "san-rms": {"norm": "rms"},
    "standard-rms": {"ffn": True, "norm": "rms"},
    "san-no-qk-norm": {"qk_norm": False},
    "standard-no-qk-norm": {"ffn": True, "qk_norm": False},
    "san-rezero": {"residual": "rezero"},
    "standard-residual": {"ffn": True, "residual": "standard"},
    "san-no-residual": {"residual": "none"},
    "san-sandwich": {"sandwich_norm": True},
    "standard-sandwich": {"ffn": True, "sandwich_norm": True},
    "mlp": {"mixer": "mlp"},
    "approximate": {"mixer": "approximate", "mixer_options": {"chunk": 8}},
    "non-approximate": {"mixer": "non_approximate"},
    "non-approximate-no-qk-norm": {"mixer": "non_approximate", "qk_norm": False},
    "mixit": {"mixer": "mixit", "mixer_options": {"seq_len": SEQ_LEN}},
    "static-emb-qk": {"mixer": "static_emb_qk", "ffn": True},
    "hybrid": {"mixer": "non_approximate", "layout": "hybrid", "ffn": True},
    "per-layer": {"layout": ["mixit", "approximate", "mlp"], "n_layers": 3},
    "rnd-emb-qk": {"mixer": "rnd_emb_qk", "ffn": True},
    "fixed-seq-qk": {"mixer": "fixed_seq_qk", "layout": "hybrid"},
}


def _mixit_sigma_lengths() -> dict[str, dict]:
    """MixiT with σ_h set by the prefix or the row, where the mixer has that option."""
    from sanlab.model.mixers import MIXERS

    if "sigma_length" not in MIXERS["mixit"].Options.model_fields:
        return {}
    return {f"mixit-{m}": {"mixer": "mixit", "mixer_options": {"seq_len": SEQ_LEN, "sigma_length": m}}
            for m in ("prefix", "row")}


def _non_approximate_qk_norm() -> dict[str, dict]:
    """Non-approximate with its own QK-norm option on, where the mixer has that option
    (model.qk_norm then does not decide it)."""
    from sanlab.model.mixers import MIXERS

    if "qk_norm" not in MIXERS["non_approximate"].Options.model_fields:
        return {}
    return {"non-approximate-own-qk-norm": {"mixer": "non_approximate", "mixer_options": {"qk_norm": True}}}


CONFIGS |= _mixit_sigma_lengths() | _non_approximate_qk_norm()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, train_data_dir: Path) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("hfexport")
    out = {}
    for i, (name, model) in enumerate(CONFIGS.items()):
        run = make_run(root / "runs" / name, train_data_dir, seed=i, **model)
        assert main(["export", str(run), "--hf", str(root / "hf" / name)]) == 0
        out[name] = (run, root / "hf" / name)
    return out


def _ids(B: int, T: int, seed: int, vocab: int = 320) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, vocab, (B, T), generator=g)
    ids[:, 0] = 2  # BOS, as every document starts
    return ids


def _pattern_hooks(model) -> list[str]:
    return [n for n, _ in model.named_modules() if n.endswith("attn.pattern")]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_computes_what_sanlab_computes(exported, train_data_dir: Path, name: str) -> None:
    run, folder = exported[name]
    ref, hf = load_sanlab(run), load_hf(folder)
    assert type(hf).__name__ == "SanlabForCausalLM"
    ids = _ids(2, SEQ_LEN, 0)
    with torch.no_grad():
        # logits, one document per row, with hidden states and patterns
        names = _pattern_hooks(ref) + [f"blocks.{i}.resid_post" for i in range(len(ref.blocks))] + ["final"]
        with capture(ref, names) as acts:
            want = ref(ids)
        got = hf(ids, output_hidden_states=True, output_attentions=True)
        torch.testing.assert_close(got.logits, want, **TOL)
        # transformers' convention: the embedding, each block's output, the last one after the final norm
        assert len(got.hidden_states) == len(ref.blocks) + 1
        torch.testing.assert_close(got.hidden_states[-1], acts["final"], **TOL)
        torch.testing.assert_close(got.hidden_states[0], ref.embed(ids) * ref.embed_scale, **TOL)
        by_rows = hf(inputs_embeds=hf.get_input_embeddings()(ids)).logits  # scaled inside, as input_ids are
        torch.testing.assert_close(by_rows, hf(ids).logits, atol=0, rtol=0)
        for i, h in enumerate(got.hidden_states[1:-1]):
            torch.testing.assert_close(h, acts[f"blocks.{i}.resid_post"], **TOL)
        for i, a in enumerate(got.attentions):
            key = f"blocks.{i}.attn.pattern"
            if key in acts:
                torch.testing.assert_close(a, acts[key].expand_as(a), **TOL)
            else:
                assert a is None and ref.cfg.layer_mixers[i] == "mlp"

        # padded batches: each row's real tokens get the logits the row gets alone
        lengths = [SEQ_LEN, 9, 17]
        rows = [_ids(1, n, 10 + n)[0] for n in lengths]
        for side in ("left", "right"):
            batch = torch.zeros(len(rows), SEQ_LEN, dtype=torch.long)
            mask = torch.zeros_like(batch)
            for r, row in enumerate(rows):
                where = slice(SEQ_LEN - len(row), SEQ_LEN) if side == "left" else slice(0, len(row))
                batch[r, where], mask[r, where] = row, 1
            logits = hf(batch, attention_mask=mask).logits
            for r, row in enumerate(rows):
                alone = ref(row[None])[0]
                real = logits[r][mask[r].bool()]
                torch.testing.assert_close(real, alone, **TOL, msg=f"{side} padding, row of {len(row)}")

    # greedy generation: the tokens of sanlab's decoder, with and without the KV cache
    from sanlab.model.generate import SamplingConfig, generate

    prompt = _ids(1, 7, 3)
    want = list(generate(ref, prompt[0], SamplingConfig(max_new_tokens=12, temperature=0), max_len=SEQ_LEN))
    for use_cache in (True, False) if hf.config.use_cache else (False,):
        out = hf.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=use_cache, eos_token_id=None)
        assert out[0, 7:].tolist() == want, f"use_cache={use_cache}"
    if not hf.config.use_cache:  # weights set by the whole sequence's length: a cache would go stale
        assert not json.loads((folder / "generation_config.json").read_text())["use_cache"]
        with pytest.raises(ValueError, match="use_cache=False"):
            hf.generate(prompt, max_new_tokens=2, do_sample=False, use_cache=True)
    # a left-padded batch generates each row's own tokens
    short = _ids(1, 4, 4)
    batch = torch.cat([prompt, torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                      pad_token_id=0)
    assert out[0, 7:].tolist() == want[:8]
    alone = list(generate(ref, short[0], SamplingConfig(max_new_tokens=8, temperature=0), max_len=SEQ_LEN))
    assert out[1, 7:].tolist() == alone

    # the loss on packed validation rows: sanlab's evaluation loss
    from sanlab.data.loader import Loader
    from sanlab.model.attention import segment_positions
    from sanlab.train.trainer import evaluate

    val = Loader(train_data_dir, "val", batch_rows=8)
    batch = next(b for b in val.eval_batches(None, 8) if int(b["segment_ids"].max()) > 0)  # packed rows
    want = evaluate(ref, [batch], torch.autograd.grad_mode.no_grad, _OneProcess())["val_loss"]
    labels = batch["targets"].masked_fill(~batch["loss_mask"], -100)
    with torch.no_grad():
        got = hf(batch["inputs"], position_ids=segment_positions(batch["segment_ids"]), shift_labels=labels).loss
    assert abs(got.item() - want) < 1e-5, (got.item(), want)


class _OneProcess:
    @staticmethod
    def sum(values):
        return values


def test_folder_layout_config_and_no_pickle(exported) -> None:
    run, folder = exported["standard"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        "README.md", "config.json", "configuration_sanlab.py", "generation_config.json", "model.safetensors",
        "modeling_sanlab.py", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"])
    config = json.loads((folder / "config.json").read_text())
    cfg = json.loads((run / "config.json").read_text())["model"]
    assert config["model_type"] == "sanlab" and config["auto_map"]["AutoModelForCausalLM"] == \
        "modeling_sanlab.SanlabForCausalLM"
    for key, value in cfg.items():  # every model field of the run
        assert config[key] == value, key
    assert config["seq_len"] == SEQ_LEN
    # no pickle anywhere: every file is text or safetensors
    for p in folder.iterdir():
        head = p.read_bytes()[:2]
        assert head != b"\x80\x04" and head[:1] != b"\x80", p
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    # the tied embedding is stored once, under sanlab's name
    assert "model.embed.weight" in keys and not any("lm_head" in k for k in keys)
    ref = load_sanlab(run)
    assert keys == {"model." + k for k in ref.state_dict()}
    hf = load_hf(folder)
    assert hf.config.max_position_embeddings == SEQ_LEN and hf.config.hidden_size == cfg["d_model"]
    assert hf.get_input_embeddings().weight.data_ptr() == hf.model.embed.weight.data_ptr()


def test_tokenizer_ids_bos_and_chat_template(exported, train_data_dir: Path) -> None:
    from transformers import AutoTokenizer

    from sanlab.data.tokenizer import load_tokenizer

    _, folder = exported["san"]
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    assert [tok.convert_tokens_to_ids(s) for s in specials] == list(range(8))
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    raw = load_tokenizer(train_data_dir)
    text = "<|im_start|>user\nWhere was the teacher born?<|im_end|>"
    assert tok(text).input_ids == [2] + raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok(text).input_ids, skip_special_tokens=False) == "<bos>" + text
    chat = [{"role": "user", "content": "Where?"},
            {"role": "assistant", "content": "In Vaelmor.", "reasoning_content": "The notes say so."}]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    assert rendered == ("<bos><|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n<think>\n"
                        "The notes say so.\n</think>\nIn Vaelmor.<|im_end|>")
    prompt = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<bos><|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n"


def test_greedy_generate_equals_sanlab_sample(exported, capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoTokenizer

    for name in ("standard", "mixit"):
        run, folder = exported[name]
        prompt = "<|im_start|>user\nWhere was"
        assert main(["sample", str(run), "--prompt", prompt, "--max-new-tokens", "10", "--temperature", "0"]) == 0
        said = capsys.readouterr().out
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
        hf = load_hf(folder)
        ids = tok(prompt, return_tensors="pt").input_ids
        for use_cache in (True, False) if hf.config.use_cache else (False,):
            out = hf.generate(ids, max_new_tokens=10, do_sample=False, use_cache=use_cache)
            new = out[0, ids.shape[1]:].tolist()
            new = new[: new.index(1)] if 1 in new else new  # sample stops at EOS and does not print it
            assert prompt + tok.decode(new, skip_special_tokens=False) + "\n" == said, (name, use_cache)


def test_remote_code_imports_torch_and_transformers_only() -> None:
    """The fast half of the check below: the two files' imports, read from their source."""
    import ast

    from sanlab.hf.export import REMOTE_DIR, REMOTE_FILES

    for name in REMOTE_FILES:
        tree = ast.parse((REMOTE_DIR / name).read_text())
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots.add("." if node.level else node.module.split(".")[0])
        assert roots <= {"math", "torch", "transformers", "."}, (name, roots)


def test_loads_without_sanlab(exported, tmp_path: Path) -> None:
    """A user without sanlab: the folders load and compute in a process where importing
    sanlab fails."""
    import subprocess
    import sys

    names = ["standard", "mixit", "per-layer"]
    ids = _ids(2, SEQ_LEN, 5)
    child = f"""
import sys
class NoSanlab:
    def find_spec(self, name, path=None, target=None):
        if name == "sanlab" or name.startswith("sanlab."):
            raise ImportError("sanlab is not installed here")
sys.meta_path.insert(0, NoSanlab())
import torch
from transformers import AutoModelForCausalLM
ids = torch.tensor({ids.tolist()})
out = {{}}
for name in {names!r}:
    m = AutoModelForCausalLM.from_pretrained({str(exported['standard'][1].parent)!r} + "/" + name,
                                             trust_remote_code=True, use_safetensors=True).eval()
    with torch.no_grad():
        out[name] = m(ids).logits
try:
    import sanlab  # noqa: F401
    raise SystemExit("sanlab was importable")
except ImportError:
    pass
torch.save(out, {str(tmp_path / 'logits.pt')!r})
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(tmp_path / "logits.pt")
    for name in names:
        with torch.no_grad():
            torch.testing.assert_close(got[name], load_sanlab(exported[name][0])(ids), **TOL)


def _refused(capsys: pytest.CaptureFixture, argv: list[str], out: Path, why: str) -> None:
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1 and why in err, err
    after = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    assert after == before  # nothing written
    assert not any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir())


def test_bad_input_is_one_line_and_writes_nothing(exported, tmp_path: Path, train_data_dir: Path,
                                                  capsys: pytest.CaptureFixture, monkeypatch) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)
    run, _ = exported["san"]
    out = Path("out")  # relative, as a user types it
    # a run dir without a checkpoint
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "config.json", bare / "config.json")
    _refused(capsys, ["export", str(bare), "--hf", str(out)], out, "no checkpoint 'latest' to export")
    _refused(capsys, ["export", "no-such-run", "--hf", str(out)], out, "run dir not found")
    _refused(capsys, ["export", str(run), "--hf", str(out), "--checkpoint", "milestone-050"], out,
             "no checkpoint 'milestone-050'")
    # a corrupted checkpoint: 4 bytes of tensor data flipped, header intact
    bad = tmp_path / "corrupt"
    shutil.copytree(run, bad)
    f = bad / "checkpoints" / "latest" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-8:-4] = bytes(b ^ 0xFF for b in data[-8:-4])
    f.write_bytes(bytes(data))
    _refused(capsys, ["export", str(bad), "--hf", str(out)], out, "checksum mismatch")
    # weights that do not fit config.json
    other = tmp_path / "other"
    shutil.copytree(run, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model"]["vocab_size"] = 400
    (other / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, ["export", str(other), "--hf", str(out)], out, "embed.weight has shape [320, 32], "
             "config.json gives [400, 32]")
    # an OUT that exists and is not empty
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    _refused(capsys, ["export", str(run), "--hf", str(out)], out, "exists and is not empty")
    assert (out / "mine.txt").read_text() == "keep me"
    shutil.rmtree(out)
    # a variant the exported code does not compute: one registered by a user
    from sanlab.model.mixers import MIXERS
    from sanlab.model.mixers.softmax import SoftmaxAttention, SoftmaxSpec

    spec = type("MySpec", (SoftmaxSpec,), {"name": "my_mixer"})
    type("MyMixer", (SoftmaxAttention,), {"spec": spec})
    monkeypatch.setitem(MIXERS, "my_mixer", spec)  # what @register_mixer does
    mine = make_run(tmp_path / "mine", train_data_dir, mixer="my_mixer")
    _refused(capsys, ["export", str(mine), "--hf", str(out)], out, "model.mixer my_mixer cannot be exported")
    assert not out.exists()
    # an empty OUT is fine, and so is a relative run dir
    out.mkdir()
    assert main(["export", os.path.relpath(run), "--hf", str(out)]) == 0
    assert (out / "model.safetensors").is_file()


def test_import_round_trip(exported, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """export -> import gives back the run's model section and weights bit for bit; the
    imported run dir samples as the original does and exports again to the same weights."""
    from safetensors.torch import load_file

    for name in ("standard", "per-layer", "rnd-emb-qk"):
        run, folder = exported[name]
        back = tmp_path / name
        assert main(["import", "--hf", str(folder), "--out", str(back)]) == 0
        assert json.loads((back / "config.json").read_text())["model"] == \
            json.loads((run / "config.json").read_text())["model"]
        a = load_file(str(run / "checkpoints/latest/model.safetensors"))
        b = load_file(str(back / "checkpoints/latest/model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        capsys.readouterr()
        argv = ["--prompt", "<|im_start|>user\nWhere", "--max-new-tokens", "6", "--temperature", "0"]
        assert main(["sample", str(run), *argv]) == 0
        said = capsys.readouterr().out
        assert main(["sample", str(back), *argv]) == 0
        assert capsys.readouterr().out == said
        again = tmp_path / f"{name}-again"
        assert main(["export", str(back), "--hf", str(again)]) == 0
        assert load_file(str(again / "model.safetensors")).keys() == load_file(str(folder / "model.safetensors")).keys()
    # a folder that is not a sanlab export, and an occupied --out: one line, nothing written
    stock = tmp_path / "stock"
    stock.mkdir()
    (stock / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _refused(capsys, ["import", "--hf", str(stock), "--out", str(tmp_path / "x")], tmp_path / "x",
             "not a sanlab export")
    _refused(capsys, ["import", "--hf", str(exported["san"][1]), "--out", str(tmp_path / "standard")],
             tmp_path / "standard", "exists and is not empty")
    # an imported run is not a training checkpoint: resuming it is refused in one line
    assert main(["train", "--resume", "--out", str(tmp_path / "standard")]) == 2


def test_chat_template_writes_the_training_documents(exported, train_data_dir: Path) -> None:
    """The chat template renders SYNTH documents to exactly the ids they were trained on
    ([BOS] + the region-by-region encoding of `sanlab prepare`)."""
    import itertools

    from transformers import AutoTokenizer

    from sanlab.data.synth import SynthConfig, documents
    from sanlab.data.tokenizer import encode_documents, load_tokenizer

    tok = AutoTokenizer.from_pretrained(str(exported["san"][1]), trust_remote_code=True)
    raw = load_tokenizer(train_data_dir)
    docs = list(itertools.islice(documents(SynthConfig(), seed=0), 30))
    for doc, (ids, _) in zip(docs, encode_documents(raw, docs)):
        s = [sp.text for sp in doc.spans]
        assert s[1].startswith("user\n") and s[5] == "assistant\n", s[:6]
        assert (s[6], s[8]) == ("<think>", "</think>")
        chat = [{"role": "user", "content": s[1][len("user\n"):]},
                {"role": "assistant", "content": s[9][1:], "reasoning_content": s[7][1:-1]}]
        rendered = tok.apply_chat_template(chat, tokenize=True, return_dict=False)
        assert list(rendered) == [2] + ids.tolist(), doc.exercise


def test_model_card_states_the_runs_numbers(exported) -> None:
    from sanlab.accounting import count_flops, count_params
    from sanlab.analysis.rundir import RunDir

    run, folder = exported["hybrid"]
    card = (folder / "README.md").read_text()
    cfg = RunDir.open(run).config
    p, f = count_params(cfg.model), count_flops(cfg.model, SEQ_LEN)
    for text in (f"| parameters, total | {p.total:,} |", f"| parameters, non-embedding | {p.non_embedding:,} |",
                 f"| forward FLOPs per token at T={SEQ_LEN} | {f.forward:,} |",
                 f"| training FLOPs per token (3× forward) | {f.train:,} |",
                 "| run id | `hybrid` |", "| validation loss (nats/token) | 4.3210 |", "| git commit | `0123abc` |",
                 "| tokens trained | 768 |", "checkpoint | `latest` (step 6)",
                 "| sequence mixer per layer | 0: softmax, 1: non_approximate, 2: softmax |"):
        assert text in card, text


def test_model_card_names_the_study_of_a_run_in_a_study_dir(tmp_path: Path, train_data_dir: Path) -> None:
    study = tmp_path / "study"
    run = make_run(study / "runs" / "san-L3-d32-muon-lr0.02-768-s1", train_data_dir)
    (study / "study.json").write_text(json.dumps({"name": "quick"}))
    (study / "results.jsonl").write_text(json.dumps({"type": "run", "run_id": run.name, "arm": "san",
                                                     "phases": ["final"], "seed": 1}) + "\n")
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert "| study | quick: arm san, phases final, seed 1 |" in (tmp_path / "hf" / "README.md").read_text()


def test_export_a_milestone_by_percentage(tmp_path: Path, train_data_dir: Path) -> None:
    import shutil

    run = make_run(tmp_path / "run", train_data_dir)
    shutil.copytree(run / "checkpoints" / "latest", run / "checkpoints" / "milestone-050")
    assert main(["export", str(run), "--hf", str(tmp_path / "hf"), "--checkpoint", "50"]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["sanlab"]["checkpoint"] == "milestone-050" and config["sanlab"]["step"] == 6
    assert "`milestone-050` (step 6)" in (tmp_path / "hf" / "README.md").read_text()
