"""`sanlab.paths.staged_dir`: a directory written whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from sanlab.paths import staged_dir


def test_staged_dir_replaces_out_only_when_the_block_finishes(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_dir(out) as tmp:
            (tmp / "new.txt").write_text("half")
            raise RuntimeError("killed mid-way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temp dir left behind
    assert [p.name for p in out.iterdir()] == ["old.txt"]  # the old dir is untouched
    with staged_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp != out
        (tmp / "new.txt").write_text("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert [p.name for p in out.iterdir()] == ["new.txt"]  # replaced, old contents gone


def test_staged_dir_creates_missing_parents(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "data"
    with staged_dir(out) as tmp:
        (tmp / "x").write_text("1")
    assert (out / "x").read_text() == "1"
