"""The model card of an exported folder, as the Hub reads it: YAML front matter (license,
library_name, tags, the run's own zero-shot results), limitations, no internal
references, a usage snippet that runs as written, the embedding as config.json has it,
and the provenance (corpus, prepare seed, losses) kept through import → re-export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_helpers import make_run
from sanlab.cli import main

yaml = pytest.importorskip("yaml")


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert m, text[:200]
    return yaml.safe_load(m.group(1)), text


@pytest.fixture
def world(tmp_path: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """runs/san (a standard arm) with a full evaluation and a limited one; the cwd is tmp_path."""
    import shutil

    shutil.copytree(train_data_dir, tmp_path / "data")
    run = make_run(tmp_path / "runs" / "san", tmp_path / "data", ffn=True)
    (run / "eval").mkdir()
    task = {"metrics": {"acc": 0.295, "acc_stderr": 0.0323}, "n_samples": {"effective": 200}, "limit": None}
    # a task a --limit run wrote into this file before limited runs had their own file
    legacy = {"metrics": {"acc": 0.8}, "n_samples": {"effective": 10}, "limit": 10}
    (run / "eval" / "results-latest.json").write_text(json.dumps(
        {"run": "runs/san", "checkpoint": "latest", "tasks": {"sanlab_grounded_qa": task,
                                                              "sanlab_closed_book_qa": legacy}}))
    (run / "eval" / "results-latest-limit5.json").write_text(json.dumps(
        {"run": "runs/san", "checkpoint": "latest", "limit": 5,
         "tasks": {"sanlab_cloze": {"metrics": {"acc": 0.9}, "limit": 5}}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_card_has_hub_front_matter_limitations_and_the_runs_eval(world: Path) -> None:
    assert main(["export", "runs/san", "--hf", "hf/san"]) == 0
    meta, text = _card(world / "hf" / "san")
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-generation" and "sanlab" in meta["tags"]
    (index,) = meta["model-index"]
    assert index["name"] == "san"
    assert [(r["dataset"]["name"], r["metrics"][0]["type"], r["metrics"][0]["value"]) for r in index["results"]] \
        == [("sanlab_grounded_qa", "acc", 0.295)]  # the full evaluation only, never the --limit one
    assert "| sanlab_grounded_qa | acc | 0.2950 ± 0.0323 | 200 |" in text
    assert "sanlab_cloze" not in text and "sanlab_closed_book_qa" not in text
    assert "## Limitations" in text
    assert "SPEC" not in text and "§" not in text


def test_the_card_says_what_config_json_says_of_the_embedding(world: Path) -> None:
    pytest.importorskip("transformers")
    assert main(["export", "runs/san", "--hf", "qwen3", "--as", "qwen3"]) == 0
    assert json.loads((world / "qwen3" / "config.json").read_text())["tie_word_embeddings"] is False
    _, text = _card(world / "qwen3")
    assert "| vocabulary | 320 (untied: input table E·√d, output head E) |" in text and "tied embedding" not in text
    meta, _ = _card(world / "qwen3")
    assert "qwen3" in meta["tags"]


@pytest.mark.parametrize("family", [None, "qwen3"])
def test_the_cards_snippet_runs_as_written(world: Path, family: str | None) -> None:
    """The snippet, copied from the card, run from the folder's parent with no terminal to
    answer a prompt: transformers' "run the custom code?" question would fail it."""
    pytest.importorskip("transformers")
    argv = ["export", "runs/san", "--hf", "model"] + (["--as", family] if family else [])
    assert main(argv) == 0
    _, text = _card(world / "model")
    snippet = text.split("```python\n")[1].split("```")[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-c", snippet], cwd=world, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("<bos><|im_start|>user\nWho"), done.stdout  # the prompt, then 20 tokens


def test_provenance_survives_import_and_reexport(world: Path) -> None:
    manifest = json.loads((world / "data" / "manifest.json").read_text())
    assert main(["export", "runs/san", "--hf", "hf/san"]) == 0
    assert main(["import", "--hf", "hf/san", "--out", "runs/san-back"]) == 0
    assert main(["export", "runs/san-back", "--hf", "hf/san-again"]) == 0
    corpus = f"Corpus `{manifest['corpus']}` (prepare seed {manifest['seed']})"
    for folder in ("san", "san-again"):
        _, text = _card(world / "hf" / folder)
        assert corpus in text and "| validation loss (nats/token) | 4.3210 |" in text, folder
        data = json.loads((world / "hf" / folder / "config.json").read_text())["sanlab"]["data"]
        assert (data["corpus"], data["seed"]) == (manifest["corpus"], manifest["seed"])
    _, again = _card(world / "hf" / "san-again")
    assert "| imported from | run `san`, checkpoint `latest` |" in again
