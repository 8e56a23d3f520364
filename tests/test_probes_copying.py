"""The copying probe task (src/sanlab/data/probes/copying.py): the task file is the whole of
it. Its examples, its loss mask and its exact-match accuracy are what docs/commands/probe.md
defines, and every consumer of the task registry sees it without an edit of its own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from probe_helpers import use_in_process_runner

from sanlab.cli import main
from sanlab.data.loader import Loader
from sanlab.data.probes import TASKS, task_config, write_probe_dir
from sanlab.data.tokenizer import load_tokenizer
from sanlab.errors import ConfigError
from sanlab.probes.evaluate import accuracy

SMALL = ["n_train=300", "n_val=40", "n_test=60", "n_min=2", "n_max=7", "symbols=5"]


def test_the_answer_is_the_string_before_the_separator() -> None:
    gen = TASKS["copying"].generate(task_config("copying", SMALL))
    lengths = set()
    for ex in [e for s in gen.splits.values() for e in s]:
        assert ex.prompt[-1] == "|" and "|" not in ex.prompt[:-1]
        assert ex.answer == ex.prompt[:-1]
        assert 2 <= len(ex.answer) <= 7 and all(re.fullmatch(r"c[0-4]", t) for t in ex.answer)
        lengths.add(len(ex.answer))
    assert lengths == set(range(2, 8))  # n uniform in [n_min, n_max]: every length occurs
    assert gen.vocab == ["_", "c0", "c1", "c2", "c3", "c4", "|"]


def test_splits_are_disjoint_and_seeds_reproduce() -> None:
    a, b = (TASKS["copying"].generate(task_config("copying", SMALL)) for _ in range(2))
    c = TASKS["copying"].generate(task_config("copying", [*SMALL, "seed=1"]))
    assert a.splits == b.splits and a.splits["train"] != c.splits["train"]
    sets = [{ex.tokens for ex in a.splits[s]} for s in ("train", "val", "test")]
    assert [len(s) for s in sets] == [300, 40, 60]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])


class _Copier(torch.nn.Module):
    """Predicts each copied token from the string before the separator (the task's
    definition), and token 0 everywhere else: right on every copied token, wrong on every
    prompt token. `wrong_first`: the first copied token of the first row's first document
    is mispredicted. Ids: 0-7 the specials, 8 the filler, then the symbols, then the separator."""

    def __init__(self, sep: int, wrong_first: bool = False) -> None:
        super().__init__()
        self.sep, self.wrong_first = sep, wrong_first

    def forward(self, inputs: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        x = inputs.numpy()
        pred = np.zeros_like(x)
        for r in range(x.shape[0]):
            seps = np.flatnonzero(x[r] == self.sep)
            for i, p in enumerate(seps):
                start = p - 1
                while start > 0 and 9 <= x[r, start - 1] < self.sep:  # back to the string's first symbol
                    start -= 1
                n = p - start
                pred[r, p : p + n] = x[r, start : start + n]
                if self.wrong_first and r == 0 and i == 0:
                    pred[r, p] = (pred[r, p] - 9 + 1) % (self.sep - 9) + 9  # another symbol
        return torch.nn.functional.one_hot(torch.as_tensor(pred), 64).float()


def test_loss_and_accuracy_are_on_the_copied_tokens_only(tmp_path: Path) -> None:
    cfg = task_config("copying", SMALL)
    gen = TASKS["copying"].generate(cfg)
    write_probe_dir(TASKS["copying"], cfg, tmp_path / "c", row_tokens=64)
    tok = load_tokenizer(tmp_path / "c")
    for batch in Loader(tmp_path / "c", split="test", batch_rows=1).eval_batches(batch_rows=64):
        mask, docs, tgt = batch["loss_mask"], batch["doc_ids"], batch["targets"]
        per_doc: dict[int, list[int]] = {}
        for d, t in zip(docs[mask].tolist(), tgt[mask].tolist()):
            per_doc.setdefault(d, []).append(t)
        for d, ids in per_doc.items():  # the loss covers the n copied tokens, nothing else
            assert ids == [tok.token_to_id(t) for t in gen.splits["test"][d].answer]
    sep = tok.token_to_id("|")
    # Every copied token right, every prompt token wrong: 100%, so the prompt is not scored.
    assert accuracy(_Copier(sep), tmp_path / "c", "test") == {"correct": 60, "total": 60, "accuracy": 1.0}
    # One copied token wrong: that example is wrong (exact match over all copied tokens).
    assert accuracy(_Copier(sep, wrong_first=True), tmp_path / "c", "test")["correct"] == 59


@pytest.mark.parametrize("items, message", [
    (["n_min=5", "n_max=4"], "need 1 <= n_min <= n_max"),
    (["n_min=0"], "need 1 <= n_min <= n_max"),
    (["symbols=1"], "symbols must be at least 2"),
    (["n_max=513"], "n_max must be at most 512"),
])
def test_impossible_settings_are_one_line_errors(items: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        task_config("copying", items)
    assert "\n" not in str(e.value)


def test_a_space_too_small_is_an_error_not_a_hang() -> None:
    with pytest.raises(ConfigError, match="distinct copying examples"):
        TASKS["copying"].generate(task_config("copying", ["n_min=1", "n_max=2", "symbols=2", "n_train=10"]))


def test_sanlab_probe_copying_runs_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI, the runner's defaults, the results and the listing read the task from its
    file: `sanlab probe copying` with relative paths, from a directory that is not the repo."""
    use_in_process_runner(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "--list"]) == 0
    assert re.search(r"^  copying +reproduce a random string", capsys.readouterr().out, re.M)
    tiny = ["model.d_model=16", "model.n_heads=2", "model.n_kv_heads=1", "train.steps=3", "train.batch_rows=4",
            "row_tokens=64", "sweep.grid=[1]", "sweep.max_extensions=0"]
    assert main(["probe", "copying", "--arms", "standard", "--quick", *tiny, "task.n_train=40", "task.n_val=8",
                 "task.n_test=12", "--out", "o"]) == 0
    res: dict[str, Any] = json.loads(Path("o/probe-copying.json").read_text())
    (cell,) = res["cells"]
    assert cell["task"] == "copying" and cell["test_total"] == 12
    assert cell["task_config"] == {"seed": 0, "n_train": 40, "n_val": 8, "n_test": 12, "n_min": 4, "n_max": 12,
                                   "symbols": 16}
    cfg = json.loads((Path("o") / cell["points"][0]["run_dir"] / "config.json").read_text())
    assert cfg["train"]["steps"] == 3  # the user's override over the task's quick default (250)
    assert "Copying" in capsys.readouterr().out  # the grid's heading is the task's label


def test_the_registry_gives_each_consumer_the_task_s_own_declarations() -> None:
    """What the task files declare is what the runner, the suite and the records read: the
    defaults (full and --quick), SPEC §2's columns in its order (copying and memorize's own
    accuracy are not among them), the headings and the paper's numbers."""
    from sanlab.probes import suite
    from sanlab.probes.runner import task_settings
    from sanlab.records import probes as records_probes

    quick, run_quick = task_settings("copying", True, [])
    full, run_full = task_settings("copying", False, ["seed=3"])
    assert (quick.n_train, run_quick) == (20000, ["train.steps=250"])
    assert (full.n_train, full.seed, run_full) == (50000, 3, ["train.steps=3000"])
    retrieval, run = task_settings("retrieval", False, [])
    assert (retrieval.m_max, run) == (16, ["train.batch_rows=64", "train.steps=1000"])
    assert suite.SUITE_TASKS == ("addition", "modadd", "capacity", "retrieval", "induction", "dyck", "sentiment")
    assert suite.COLUMNS["copying"] == records_probes.COLUMNS["copying"] == "Copying"
    assert suite.ANCHORS["mixit"] == {"addition": "≈ standard", "modadd": "≈ standard", "capacity": 2.18,
                                      "retrieval": 11.2, "dyck": "≈ standard", "sentiment": "≈ standard"}
    assert records_probes.MIXIT_MATCHES == ("addition", "modadd", "dyck", "sentiment")
    assert list(TASKS)[:5] == ["addition", "modadd", "memorize", "retrieval", "copying"]
    with pytest.raises(ConfigError, match="unknown probe task 'nosuch'"):
        task_settings("nosuch", True, [])  # a one-line error, not a KeyError
