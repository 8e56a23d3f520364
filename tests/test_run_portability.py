"""Runs that work from any directory, and data that is compared by what it encodes.

- `sanlab train` with a relative `data.dir` stores it absolute, so `sample` from another
  directory finds the data; a run dir written before (a relative path) still resolves
  from a directory above it.
- An imported run is analysed and sampled with its original data: the tokenizer copied
  through export and import differs in bytes, not in a single id.
- A `--data` whose tokenizer truly differs is refused alike by analyze, sample, eval and
  export, with the fix in the message.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hf_helpers import make_run
from sanlab.cli import main
from test_analysis_cli import swap_two_tokens

TINY = ["model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=320", "model.n_layers=1"]
TRAIN = ["data.seq_len=32", "train.steps=2", "train.batch_rows=4", "train.eval_rows=4", "train.eval_every=0",
         "train.log_every=100", "train.device=cpu", "train.precision=fp32"]  # fmt: skip


def _sample(run: str, capsys: pytest.CaptureFixture, *extra: str) -> str:
    rc = main(["sample", run, "--prompt", "Who", "--max-new-tokens", "3", "--temperature", "0", *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out


def test_a_run_trained_with_a_relative_data_dir_samples_from_any_directory(
        tmp_path: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    shutil.copytree(train_data_dir, a / "data" / "synth")
    monkeypatch.chdir(a)
    assert main(["train", "--out", "runs/san", "data.dir=data/synth", *TINY, *TRAIN]) == 0
    stored = json.loads((a / "runs" / "san" / "config.json").read_text())["data"]["dir"]
    assert Path(stored) == a / "data" / "synth"
    assert main(["train", "--out", "runs/san", "data.dir=data/synth", *TINY, *TRAIN]) == 0  # the same run: done
    capsys.readouterr()
    here = _sample("runs/san", capsys)
    monkeypatch.chdir(b)
    assert _sample("../a/runs/san", capsys) == here


def test_a_run_dir_written_with_a_relative_data_dir_still_resolves(
        tmp_path: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Run dirs written before data.dir was stored absolute: `data/synth`, relative to the
    directory two levels above the run dir, found from anywhere."""
    shutil.copytree(train_data_dir, tmp_path / "a" / "data" / "synth")
    run = make_run(tmp_path / "a" / "runs" / "san", None)
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "data": {**cfg["data"], "dir": "data/synth"}}))
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    assert _sample("../a/runs/san", capsys)


@pytest.fixture
def imported(tmp_path: Path, train_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run exported and imported back, from a working dir holding data/synth (relative paths)."""
    pytest.importorskip("transformers")
    shutil.copytree(train_data_dir, tmp_path / "data" / "synth")
    make_run(tmp_path / "runs" / "san", tmp_path / "data" / "synth", ffn=True)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "runs/san", "--hf", "hf/san"]) == 0
    assert main(["import", "--hf", "hf/san", "--out", "runs/san-back"]) == 0
    assert (tmp_path / "hf/san/tokenizer.json").read_bytes() != (tmp_path / "data/synth/tokenizer.json").read_bytes()
    return tmp_path


def test_an_imported_run_is_analysed_and_sampled_with_its_original_data(
        imported: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["analyze", "runs/san-back", "--data", "data/synth", "--skip", "spectra,attention,stream",
                 "--eval-rows", "4", "--out", "an"]) == 0
    assert json.loads((imported / "an" / "analysis.json").read_text())["sample"]["data_dir"] == "data/synth"
    capsys.readouterr()
    assert _sample("runs/san-back", capsys, "--data", "data/synth") == _sample("runs/san", capsys)


@pytest.mark.parametrize("argv", [
    ["analyze", "runs/san-back", "--data", "other", "--skip", "spectra"],
    ["sample", "runs/san-back", "--prompt", "Who", "--data", "other"],
    ["export", "runs/san", "--hf", "hf/again", "--data", "other"],
    ["eval", "runs/san", "--tasks", "builtin", "--data", "other"],
], ids=lambda a: a[0])
def test_a_tokenizer_that_truly_differs_is_refused_with_the_fix(
        imported: Path, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    if argv[0] == "eval":
        pytest.importorskip("lm_eval")
    shutil.copytree(imported / "data" / "synth", imported / "other")
    swap_two_tokens(imported / "other")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizers differ (the vocabulary): data other" in err, err
    assert "pass --data " in err and "sanlab prepare … tokenizer=" in err
    assert not (imported / "hf" / "again").exists() and not (imported / "runs" / "san" / "eval").exists()
