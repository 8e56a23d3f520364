"""export → load → import at settings other than the defaults: a RoPE θ, a row length and a
vocabulary that are not 10000, 256 and the tokenizer's, for every mixer the sanlab model
type exports and the stock families where they are exact. Each checks the written
config, the logits against sanlab's own forward, and that weights holding NaN or ±inf
are refused in one line with nothing written.

Tolerance of the logits: both sides are fp32 on the same weights; they differ only in the
order of operations (the exported code's attention, a stock family's folded gates and
pre-scaled embedding): measured, logits of size ~3 differ by 2e-7 … 9e-7 over every case
here. `TOL` (1e-5) is ten times that, and far below what a wrong setting moves: θ = 10000
in place of 100 changes the logits by 8e-2 at these positions (checked below, > 1e-2, so
the comparison can tell)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hf_helpers import load_hf, load_sanlab, make_run

pytest.importorskip("transformers")

from sanlab.cli import main  # noqa: E402
from sanlab.config import DataConfig, ModelConfig  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
THETA, SEQ, VOCAB = 100.0, 24, 352  # none a default; the vocabulary larger than the tokenizer's 320
ODD = dict(rope_theta=THETA, vocab_size=VOCAB, n_layers=2)
# every mixer the sanlab model type exports (sanlab.hf.export.EXPORTABLE_MIXERS), the FFN on
# some, so the state mixer goes through too
MIXERS: dict[str, dict] = {
    "softmax": {"ffn": True},
    "static_emb_qk": {},
    "approximate": {"mixer_options": {"chunk": 8}},
    "non_approximate": {"ffn": True},
    "mlp": {},
    "mixit": {"mixer_options": {"seq_len": SEQ}},
    "rnd_emb_qk": {"ffn": True},
    "fixed_seq_qk": {},
}
# the stock families on the arms they compute exactly (tests/test_hf_stock.py)
FAMILIES = {"llama": {"qk_norm": False}, "qwen3": {}, "gemma": {"qk_norm": False},
            "gemma2": {"qk_norm": False, "sandwich_norm": True}, "gemma3": {"sandwich_norm": True}}


def test_the_settings_are_not_the_defaults() -> None:
    m = ModelConfig()
    assert m.rope_theta != THETA and m.vocab_size != VOCAB and DataConfig().seq_len != SEQ


def test_every_exportable_mixer_is_covered() -> None:
    from sanlab.hf.export import EXPORTABLE_MIXERS

    assert set(MIXERS) == set(EXPORTABLE_MIXERS)


def _ids(B: int, T: int, seed: int) -> torch.Tensor:
    ids = torch.randint(8, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = 2  # BOS, as every document starts
    return ids


def _model_section(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())["model"]


@pytest.mark.parametrize("mixer", list(MIXERS))
def test_sanlab_export_load_import_round_trip(mixer: str, tmp_path: Path, train_data_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    make_run(tmp_path / "run", train_data_dir, seq_len=SEQ, mixer=mixer, **ODD, **MIXERS[mixer])
    assert main(["export", "run", "--hf", "hf"]) == 0
    config = json.loads(Path("hf/config.json").read_text())
    trained = _model_section(Path("run"))
    assert (config["rope_theta"], config["vocab_size"], config["seq_len"]) == (THETA, VOCAB, SEQ)
    assert {k: config[k] for k in trained if k != "ffn"} == {k: v for k, v in trained.items() if k != "ffn"}

    ref, hf = load_sanlab(Path("run")), load_hf(Path("hf"))
    assert hf.config.max_position_embeddings == SEQ and hf.config.vocab_size == VOCAB
    ids = _ids(2, SEQ, 0)
    with torch.no_grad():
        want = ref(ids)
        torch.testing.assert_close(hf(ids).logits, want, **TOL)

    assert main(["import", "--hf", "hf", "--out", "back"]) == 0
    back = json.loads(Path("back/config.json").read_text())
    assert back["model"] == trained  # θ and the vocabulary included
    assert back["data"]["seq_len"] == SEQ  # the folder's row length, not the default 256
    from safetensors.torch import load_file

    a = load_file("run/checkpoints/latest/model.safetensors")
    b = load_file("back/checkpoints/latest/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        assert torch.equal(load_sanlab(Path("back"))(ids), want)


def test_rope_theta_moves_the_logits_beyond_the_tolerance(tmp_path: Path, train_data_dir: Path) -> None:
    """The logits comparisons above can tell θ: the same weights at θ = 10000 differ by far
    more than `TOL` at these positions."""
    run = make_run(tmp_path / "run", train_data_dir, seq_len=SEQ, ffn=True, **ODD)
    ref = load_sanlab(run)
    other = type(ref)(ref.cfg.model_copy(update={"rope_theta": 10000.0})).eval()
    other.load_state_dict(ref.state_dict())
    ids = _ids(1, SEQ, 1)
    with torch.no_grad():
        assert (ref(ids) - other(ids)).abs().max() > 1e-2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_stock_family_writes_the_runs_settings(family: str, tmp_path: Path, train_data_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "run", train_data_dir, seq_len=SEQ, ffn=True, **ODD, **FAMILIES[family])
    assert main(["export", "run", "--hf", "hf", "--as", family]) == 0
    config = json.loads(Path("hf/config.json").read_text())
    assert (config["vocab_size"], config["max_position_embeddings"]) == (VOCAB, SEQ)
    rope = config["rope_parameters"]
    for r in rope.values() if family == "gemma3" else [rope]:  # gemma3: one per attention type
        assert r["rope_theta"] == THETA
    hf = AutoModelForCausalLM.from_pretrained("hf", use_safetensors=True).eval()  # stock code
    ids = _ids(2, SEQ, 2)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, load_sanlab(Path("run"))(ids), **TOL)


def _poison(f: Path, key: str, value: float) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(f))
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[3] = value
    save_file(tensors, str(f), metadata={"format": "pt"})


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], out: Path, why: str) -> None:
    before = sorted(os.listdir("."))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1 and why in err, err
    assert not out.exists() and sorted(os.listdir(".")) == before  # nothing written, no staging dir left


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_by_import_and_export(value: float, tmp_path: Path, train_data_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from sanlab.analysis.rundir import RunDir
    from sanlab.train.checkpoint import save
    from sanlab.train.optim import build_optimizers

    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "run", train_data_dir, seq_len=SEQ, ffn=True, **ODD)
    assert main(["export", "run", "--hf", "hf"]) == 0
    # a folder whose weights were damaged into NaN / ±inf (the folder has no checksums)
    _poison(Path("hf/model.safetensors"), "model.blocks.1.ffn.w_up.weight", value)
    _refused(capsys, ["import", "--hf", "hf", "--out", "back"], Path("back"),
             "blocks.1.ffn.w_up.weight holds non-finite values")
    # a run whose checkpoint holds them, checksums and all (a diverged run): export refuses, --as too
    shutil.copytree("run", "bad")
    model = load_sanlab(Path("run"))
    with torch.no_grad():
        model.blocks[0].attn.wq.weight.view(-1)[5] = value
    save(Path("bad/checkpoints/latest"), model, build_optimizers(model, RunDir.open("run").config.optim),
         {"step": 6})
    for extra in ([], ["--as", "qwen3"]):
        _refused(capsys, ["export", "bad", "--hf", "out", *extra], Path("out"),
                 "blocks.0.attn.wq.weight holds non-finite values")
