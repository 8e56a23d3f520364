"""lm-evaluation-harness on an exported folder (`--model hf`, `trust_remote_code=True`)
reproduces `sanlab eval`'s numbers on the built-in offline tasks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hf_helpers import make_run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None
                                or importlib.util.find_spec("transformers") is None,
                                reason="lm-eval and transformers not installed")


def _metrics(results: dict) -> dict[str, dict[str, float]]:
    return {task: {k: v for k, v in res.items() if isinstance(v, float) and "stderr" not in k}
            for task, res in results["results"].items()}


def _both(tmp_path: Path, data: Path, tasks: list[str], limit: int, add_bos: bool | None = None):
    import lm_eval
    import lm_eval.models  # noqa: F401 - registers --model hf, as lm-eval's command line does
    from lm_eval.tasks import TaskManager

    from sanlab.cli import main
    from sanlab.eval.adapter import SanlabLM
    from sanlab.eval.builtin import write_builtin_tasks
    from sanlab.eval.run import open_run

    run = make_run(tmp_path / "run", data, ffn=True)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    loaded = open_run(run, device="cpu")
    task_dir = tmp_path / "tasks"
    write_builtin_tasks(loaded, task_dir)
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    common = dict(tasks=tasks, limit=limit, task_manager=manager, bootstrap_iters=0, log_samples=False)
    ours = lm_eval.simple_evaluate(model=SanlabLM(loaded=loaded, batch_size=8), **common)
    args = f"pretrained={out},trust_remote_code=True,device=cpu,dtype=float32"
    if add_bos is not None:
        args += f",add_bos_token={add_bos}"
    theirs = lm_eval.simple_evaluate(model="hf", model_args=args, batch_size=8, **common)
    return _metrics(ours), _metrics(theirs)


def _assert_same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys() and ours
    for task in ours:
        assert ours[task].keys() == theirs[task].keys(), task
        for metric, v in ours[task].items():
            assert theirs[task][metric] == pytest.approx(v, rel=1e-5, abs=1e-6), (task, metric)


def test_lm_eval_hf_reproduces_sanlab_eval(tmp_path: Path, train_data_dir: Path) -> None:
    ours, theirs = _both(tmp_path, train_data_dir, ["sanlab_grounded_qa", "sanlab_cloze"], limit=6)
    _assert_same(ours, theirs)


def test_lm_eval_hf_reproduces_every_builtin_task(tmp_path: Path, train_data_dir: Path) -> None:
    tasks = ["sanlab_grounded_qa", "sanlab_closed_book_qa", "sanlab_closed_book_unseen", "sanlab_cloze"]
    ours, theirs = _both(tmp_path / "ll", train_data_dir, tasks, limit=20)
    _assert_same(ours, theirs)
    # rolling perplexity: lm-eval's HF model puts its BOS prefix before the tokenizer's own BOS
    # unless the tokenizer is told not to add one; then it scores what sanlab eval scores
    ours, theirs = _both(tmp_path / "roll", train_data_dir, ["sanlab_kjv_ppl"], limit=3, add_bos=False)
    _assert_same(ours, theirs)
