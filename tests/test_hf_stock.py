"""`sanlab export --as FAMILY`: stock transformers architectures, no remote code, where
they compute the run's logits exactly; a one-line refusal elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_helpers import SEQ_LEN, load_sanlab, make_run

pytest.importorskip("transformers")

from sanlab.cli import main  # noqa: E402

# family -> the standard arms it computes (SPEC §1.1 switches)
CASES = [
    ("llama", {"qk_norm": False}),
    ("llama", {"qk_norm": False, "norm": "rms", "residual": "rezero"}),
    ("qwen3", {}),
    ("qwen3", {"norm": "rms", "residual": "standard"}),
    ("gemma", {"qk_norm": False}),
    ("gemma", {"qk_norm": False, "norm": "rms"}),
    ("gemma2", {"qk_norm": False, "sandwich_norm": True}),
    ("gemma3", {"sandwich_norm": True}),
    ("gemma3", {"sandwich_norm": True, "norm": "rms", "residual": "rezero"}),
]


@pytest.mark.parametrize("family,model", CASES, ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in m.items())}"
                                                     for f, m in CASES])
def test_stock_family_gives_the_runs_logits(tmp_path: Path, train_data_dir: Path, family: str, model: dict) -> None:
    from transformers import AutoModelForCausalLM

    run = make_run(tmp_path / "run", train_data_dir, ffn=True, **model)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out), "--as", family]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert not any(f.endswith(".py") for f in files) and "model.safetensors" in files
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config
    assert config["sanlab"]["exported_as"] == family and config["sanlab"]["run_id"] == run.name  # provenance
    hf = AutoModelForCausalLM.from_pretrained(str(out), use_safetensors=True).eval()  # no remote code
    assert type(hf).__module__.startswith("transformers.models.")
    ref = load_sanlab(run)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 320, (2, SEQ_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :11] = 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ref(ids), atol=1e-5, rtol=1e-5)
        got = hf(ids, attention_mask=mask).logits[1, 11:]
        torch.testing.assert_close(got, ref(ids[1:, 11:])[0], atol=1e-5, rtol=1e-5)
    tied = config["tie_word_embeddings"]
    assert tied == (family.startswith("gemma"))  # llama / qwen3 need the √d-scaled input table apart


@pytest.mark.parametrize("family,model,why", [
    ("llama", {"ffn": False, "qk_norm": False}, "no MLP"),
    ("qwen3", {"ffn": True, "qk_norm": False}, "qwen3 always normalises q and k (this model fits --as llama / gemma)"),
    ("llama", {"ffn": True}, "model.qk_norm=true, and llama never"),
    ("gemma3", {"ffn": True}, "model.sandwich_norm=false, and gemma3 always has"),
    ("qwen3", {"ffn": True, "residual": "none"}, "residual=none"),
    ("qwen3", {"ffn": True, "mixer": "approximate"}, "not softmax attention"),
])
def test_stock_family_refuses_what_it_cannot_compute(tmp_path: Path, train_data_dir: Path,
                                                      capsys: pytest.CaptureFixture, family, model, why) -> None:
    run = make_run(tmp_path / "run", train_data_dir, **model)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out), "--as", family]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sanlab: error: --as {family}: not exact") and why in err and err.count("\n") == 1, err
    assert not out.exists()
