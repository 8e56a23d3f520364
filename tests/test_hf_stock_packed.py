"""A stock `--as FAMILY` export on packed rows, called the way a training or scoring
loop calls it: `m(input_ids=x, position_ids=pos)` with the positions restarting at every
document and transformers' default settings otherwise. Each document must get the logits
sanlab gives it (its own segment), not attend across the row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_helpers import SEQ_LEN, load_sanlab, make_run

pytest.importorskip("transformers")

from sanlab.cli import main  # noqa: E402

FAMILIES = [("llama", {"qk_norm": False}), ("qwen3", {}), ("gemma", {"qk_norm": False}),
            ("gemma2", {"qk_norm": False, "sandwich_norm": True}), ("gemma3", {"sandwich_norm": True})]
STARTS = [0, 11, 20]  # three documents in a row of SEQ_LEN tokens


@pytest.mark.parametrize("family,model", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_packed_row_with_restarting_positions_gives_each_documents_logits(
        tmp_path: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch, family: str, model: dict) -> None:
    from transformers import AutoModelForCausalLM

    make_run(tmp_path / "runs" / "run", train_data_dir, ffn=True, **model)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["export", "../runs/run", "--hf", "hf", "--as", family]) == 0
    hf = AutoModelForCausalLM.from_pretrained("hf").eval()  # every setting at its default
    ids = torch.randint(8, 320, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    bounds = STARTS + [SEQ_LEN]
    seg = torch.cat([torch.full((b - a,), i) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    pos = torch.cat([torch.arange(b - a) for a, b in zip(bounds, bounds[1:])])
    ids[:, STARTS] = 2  # BOS opens each document
    ref = load_sanlab(tmp_path / "runs" / "run")
    with torch.no_grad():
        want = ref(ids, segment_ids=seg.expand(2, -1))
        got = hf(input_ids=ids, position_ids=pos.expand(2, -1)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # each document alone gives the same logits (what "not attending across" means)
    with torch.no_grad():
        alone = ref(ids[:, STARTS[1]:STARTS[2]])
    torch.testing.assert_close(got[:, STARTS[1]:STARTS[2]], alone, atol=1e-5, rtol=1e-5)
    # generation still decodes with its cache (generation_config.json), token for token as without
    assert json.loads((work / "hf" / "generation_config.json").read_text())["use_cache"] is True
    prompt = ids[:1, :5]
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    cached = hf.generate(prompt, **kw)
    assert torch.equal(cached, hf.generate(prompt, use_cache=False, **kw))
