"""Bad input to `sanlab train` is one clear line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.errors import EXIT_USAGE
from test_train_loop import TINY


@pytest.mark.parametrize("overrides, message", [
    (["model.d_model=-1"], "d_model must be positive"),
    (["model.n_heads=3"], "n_heads=3"),
    (["train.nope=1"], "unknown key train.nope"),
    (["train.batch_rows=8", "train.micro_batch_rows=3"], "micro_batch_rows=3"),
    (["model.vocab_size=100"], "vocabulary"),
    (["data.seq_len=64"], "data.seq_len=64"),
    ([], "train.tokens=N or train.steps=N"),
], ids=["invalid", "heads", "unknown", "micro", "vocab", "seq_len", "no-length"])
def test_bad_config(train_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    overrides: list[str], message: str) -> None:
    length = [] if not overrides else ["train.steps=2"]
    argv = ["train", f"data.dir={train_data_dir}", *TINY, *length, *overrides, "--out", str(tmp_path / "r")]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1 and message in err


def test_missing_data_and_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path / "r")]
    assert main(["train", f"data.dir={tmp_path / 'nowhere'}", "train.steps=2", *out]) == EXIT_USAGE
    assert "no such directory" in capsys.readouterr().err
    assert main(["train", "train.steps=2", *out]) == EXIT_USAGE
    assert "data.dir is not set" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "missing.toml"), *out]) == EXIT_USAGE
    assert "config file not found" in capsys.readouterr().err
    assert main(["train", "train.steps=2", "--nproc", "0", *out]) == EXIT_USAGE


def test_out_dir_that_is_not_a_run_dir(train_data_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine")
    argv = ["train", f"data.dir={train_data_dir}", *TINY, "train.steps=1", "--out", str(tmp_path / "r")]
    assert main(argv) == EXIT_USAGE
    assert "not a sanlab run dir" in capsys.readouterr().err
    assert (tmp_path / "r" / "notes.txt").read_text() == "mine"


def test_toml_config_with_overrides(train_data_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(f'[data]\ndir = "{train_data_dir}"\nseq_len = 32\n[train]\nsteps = 5\n')
    assert main(["train", str(toml), *TINY, "train.steps=2", "train.eval_every=0",
                 "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 2
