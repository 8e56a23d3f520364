"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def train_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared synth dir (~40k tokens, rows of 32, vocab 320), made once per session."""
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("train-data") / "synth"
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=40000", "seq_len=32", "vocab_size=320",
                                                "val_frac=0.1"]), out)
    return out


@pytest.fixture(scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded synth corpus at the default prepare settings (2M tokens; ~5 s). Slow tests only."""
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("default-data") / "synth"
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=2000000"]), out)
    return out
