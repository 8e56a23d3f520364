"""Random byte damage to any file of a run dir or a study dir, read by every command that
reads it: the command answers as on the undamaged files (exit 0, the same result), or it
refuses in one `sanlab: error:` line (exit 2). Never a traceback, never another answer.

The damage is seeded: 1 to 3 edits at random positions, each a flipped byte, a 0xff, an
inserted or deleted byte, an inserted newline or a truncation. The files: config.json,
meta.json, metrics.jsonl, state.json and model.safetensors of `checkpoints/latest/`, and
a study's results.jsonl. The readers: sample, eval, analyze and train --resume on the run
dir; study status and study table on the study dir.

"The same result" is each command's own definition: sample's greedy continuation; eval's
metric (lm-eval's evaluation replaced by one number computed from the model, so what is
tested is sanlab's reading of the run dir); analyze's per-token losses; a resume's final
losses (training on to the end, bit-exact on the CPU). For the results store it is the
output on the lines that parse as JSON objects, each read on its own (a damaged line is
absent, as a torn one is): the expected output comes from a store holding only those.

32 seeds per (file, command), all in the default suite: a case takes about 0.1 s once the
shared run and study exist (660 of them 47 s wall, 9 CPU s on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from sanlab.cli import main

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=320",
        "data.seq_len=32", "train.batch_rows=8", "train.eval_rows=8", "train.log_every=1000", "train.steps=4",
        "train.eval_every=2", "train.milestones=[0.0,0.5,1.0]", "train.device=cpu", "train.precision=fp32"]
RUN_FILES = ("config.json", "meta.json", "metrics.jsonl", "checkpoints/latest/state.json",
             "checkpoints/latest/model.safetensors")
READERS = ("sample", "eval", "analyze", "resume")
STUDY_READERS = ("study status", "study table")


def damage(data: bytes, seed: int) -> bytes:
    """1 to 3 seeded edits of `data` (never the same bytes back)."""
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(max(len(out), 1))
        op = rng.choice(["flip", "xff", "insert", "delete", "newline", "truncate"])
        if op == "flip" and out:
            out[pos] ^= rng.randrange(1, 256)
        elif op == "xff" and out:
            out[pos] = 0xFF if out[pos] != 0xFF else 0xFE
        elif op == "insert":
            out.insert(pos, rng.randrange(256))
        elif op == "delete" and out:
            del out[pos]
        elif op == "newline":
            out.insert(pos, 0x0A)
        elif op == "truncate":
            del out[pos:]
    return bytes(out) if bytes(out) != data else data + b"\x00"


class _StopAfterTwoSteps:
    """The trainer's stop flag, raised at the second step boundary (an interrupted run)."""

    def __init__(self) -> None:
        self.reads = 0

    def __enter__(self) -> "_StopAfterTwoSteps":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def requested(self) -> bool:
        self.reads += 1
        return self.reads >= 2


class _TaskIndex:
    all_tasks = ["arc_easy"]

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


def _evaluate(model: Any, **kwargs: Any) -> dict[str, Any]:
    """lm-eval's evaluation, replaced: one number from the model's logits on fixed ids."""
    import torch

    lm = model.loaded.model
    with torch.no_grad():
        value = float(lm(torch.arange(1, 17).view(1, -1))[0].double().logsumexp(-1).sum())
    return {"results": {"arc_easy": {"acc,none": value}}, "versions": {}, "n-samples": {}}


@pytest.fixture(autouse=True)
def _no_lm_eval_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", _TaskIndex)
    monkeypatch.setattr(lm_eval, "simple_evaluate", _evaluate)


def _call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return rc, captured.out, captured.err.splitlines()


def _result(command: str, target: Path, work: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, list[str]]:
    """(exit code, the command's result by its definition, stderr lines)."""
    if command == "sample":
        rc, out, err = _call(["sample", str(target), "--prompt", "The", "--max-new-tokens", "6",
                              "--temperature", "0"], capsys)
        return rc, out, err
    if command == "eval":
        rc, _, err = _call(["eval", str(target), "--tasks", "arc_easy"], capsys)
        rec = json.loads((target / "eval" / "results-latest.json").read_text()) if rc == 0 else None
        return rc, rec and rec["tasks"]["arc_easy"]["metrics"], err
    if command == "analyze":
        out_dir = work / "analysis"
        rc, _, err = _call(["analyze", str(target), "--skip", "attention,stream", "--eval-rows", "4",
                            "--out", str(out_dir)], capsys)
        if rc != 0:
            return rc, None, err
        run = next(iter(json.loads((out_dir / "analysis.json").read_text())["runs"].values()))
        return rc, (run["losses"], run["spectra"]["per_type"]), err
    if command == "resume":
        rc, _, err = _call(["train", "--out", str(target), "--resume"], capsys)
        if rc != 0:
            return rc, None, err
        final = json.loads((target / "meta.json").read_text())["final"]
        state = json.loads((target / "checkpoints" / "latest" / "state.json").read_text())
        return rc, (final["train_loss"], final["val_loss"], state["step"]), err
    rc, out, err = _call([*command.split(), str(target), "--json"] if command == "study table"
                         else command.split() + [str(target)], capsys)
    return rc, out, err


@pytest.fixture(scope="module")
def world(train_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An interrupted run (2 of 4 steps), the completed run its resume gives, a study dir,
    and each command's result on them undamaged."""
    import sanlab.train.trainer as trainer
    from test_records import write_study

    root = tmp_path_factory.mktemp("damage")
    mp = pytest.MonkeyPatch()
    mp.setattr(trainer, "StopSignal", _StopAfterTwoSteps)
    try:
        assert main(["train", "--out", str(root / "interrupted"), f"data.dir={train_data_dir}", *TINY]) == 4
    finally:
        mp.undo()
    shutil.copytree(root / "interrupted", root / "completed")
    study = write_study(root / "study")
    return {"root": root, "interrupted": root / "interrupted", "completed": root / "completed", "study": study}


@pytest.fixture(scope="module")
def baseline(world: dict[str, Any]) -> Callable[[str, pytest.CaptureFixture[str]], Any]:
    """Each command's result on the undamaged files (computed once, on first use)."""
    cache: dict[str, Any] = {}

    def get(command: str, capsys: pytest.CaptureFixture[str]) -> Any:
        if command not in cache:
            work = world["root"] / f"baseline-{command.replace(' ', '-')}"
            work.mkdir()
            if command == "resume":
                shutil.copytree(world["interrupted"], work / "run")
                target = work / "run"
            elif command.startswith("study"):
                target = world["study"]
            else:
                target = world["completed"]
                if command in ("sample", "eval", "analyze") and "resumed" not in cache:
                    assert main(["train", "--out", str(target), "--resume"]) == 0  # the completed run
                    cache["resumed"] = True
                    capsys.readouterr()
            rc, result, err = _result(command, target, work, capsys)
            assert rc == 0 and result is not None, err
            cache[command] = result
        return cache[command]

    return get


def _expected_study_output(damaged: Path, work: Path, command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The command's output on a store of the damaged file's lines that parse as JSON
    objects, each read on its own with the standard library (the definition of a damaged
    line: absent)."""
    clean = work / "clean"
    shutil.copytree(damaged, clean)
    kept = []
    for raw in (damaged / "results.jsonl").read_bytes().split(b"\n"):
        try:
            if isinstance(json.loads(raw.decode("utf-8")), dict):
                kept.append(raw)
        except ValueError:
            pass
    (clean / "results.jsonl").write_bytes(b"".join(line + b"\n" for line in kept))
    rc, out, err = _result(command, clean, work, capsys)
    assert rc == 0, err
    return out.replace(str(clean), str(damaged))


def check(file: str, command: str, seed: int, world: dict[str, Any], baseline: Any, tmp_path: Path,
          capsys: pytest.CaptureFixture[str]) -> None:
    expected = baseline(command, capsys)
    if command.startswith("study"):
        target = tmp_path / "study"
        shutil.copytree(world["study"], target)
    else:
        target = tmp_path / "run"
        shutil.copytree(world["interrupted" if command == "resume" else "completed"], target)
        shutil.rmtree(target / "eval", ignore_errors=True)
        shutil.rmtree(target / "analysis", ignore_errors=True)
    f = target / file
    f.write_bytes(damage(f.read_bytes(), seed))
    rc, result, err = _result(command, target, tmp_path, capsys)
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("sanlab: error: "), err
        return
    if command.startswith("study"):
        expected = _expected_study_output(target, tmp_path / "expected", command, capsys)
    elif command == "sample":
        expected = expected.replace(str(world["completed"]), str(target))
    assert result == expected, (file, command, seed, err)


CASES = [(f, c) for f in RUN_FILES for c in READERS] + [("results.jsonl", c) for c in STUDY_READERS]


@pytest.mark.parametrize("seed", range(32))
@pytest.mark.parametrize("file, command", CASES, ids=[f"{c}:{Path(f).name}" for f, c in CASES])
def test_damaged_file_is_read_right_or_refused_in_one_line(file: str, command: str, seed: int,
                                                           world: dict[str, Any], baseline: Any, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    check(file, command, seed, world, baseline, tmp_path, capsys)


# --------------------------------------------------------------------------- record and suite dirs
# The same damage to a record dir (record.json, study/results.jsonl, README.md with its
# markers) read by `record check` and `record readme`, and to a probe suite's suite.json
# read by `probe --suite --merge`. What each must give, by definition:
# - exit 2: one line, and the dir unchanged;
# - a results store with a line that is not a JSON object (the standard library's reading),
#   or a record.json / suite.json that is not a JSON object: exit 2, whatever else;
# - README markers (BEGIN / END) other than the undamaged README's: exit 2;
# - `record check` exit 0: the README's blocks are the undamaged ones; exit 1: they differ;
# - `record readme` exit 0: the README's blocks are then the undamaged ones (results and
#   record.json read the same) or what the results as damaged give (still whole objects);
# - a merge exit 0: the merged suite holds the damaged piece's cells, key for key.
RECORD_FILES = ("record.json", "study/results.jsonl", "README.md")
RECORD_READERS = ("record check", "record readme")


def _blocks(text: str) -> dict[str, str]:
    from sanlab.records.readme import BLOCK

    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


def _markers(text: str) -> list[str]:
    import re

    return re.findall(r"<!-- records:(?:BEGIN|END) \S+ -->", text)


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _objects(raw: bytes) -> bool:
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line.decode("utf-8")), dict):
                return False
        except ValueError:
            return False
    return True


def _object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except ValueError:
        return False


@pytest.fixture(scope="module")
def record_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from sanlab.records.export import export
    from sanlab.records.readme import readme
    from test_records import write_study
    from malformed_round4 import suite_piece

    root = tmp_path_factory.mktemp("damage-records")
    study = write_study(root / "study")
    export(study, root / "rec", log=lambda s: None)
    readme(root / "rec", log=lambda s: None)
    (root / "piece").mkdir()
    (root / "piece" / "suite.json").write_text(json.dumps(suite_piece(), indent=1))
    return {"rec": root / "rec", "piece": root / "piece",
            "blocks": _blocks((root / "rec" / "README.md").read_text())}


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("file", RECORD_FILES)
@pytest.mark.parametrize("command", RECORD_READERS)
def test_a_damaged_record_is_read_right_or_refused_in_one_line(command: str, file: str, seed: int,
                                                               record_world: dict[str, Any], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(record_world["rec"], rec)
    f = rec / file
    original = f.read_bytes()
    f.write_bytes(damage(original, seed))
    before = _tree(rec)
    rc, _, err = _call([*command.split(), str(rec)], capsys)
    text = (rec / "README.md").read_bytes()
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("sanlab: error: "), err
        assert _tree(rec) == before, "a refusal changed the record"
        return
    damaged = f.read_bytes() if file != "README.md" or command == "record check" else before[file]
    assert not (file == "study/results.jsonl" and not _objects(damaged)), ("damaged results read", rc, err)
    assert not (file == "record.json" and not _object(damaged)), ("damaged marker read", rc, err)
    if file == "README.md":
        assert _markers(damaged.decode("utf-8", "replace")) == _markers(original.decode()), ("markers", rc, err)
    blocks = _blocks(text.decode("utf-8", "replace"))
    if command == "record check":
        assert rc in (0, 1), (rc, err)
        if file == "README.md":  # (a damaged record.json may list a file that is not there: exit 1 too)
            assert (blocks == record_world["blocks"]) == (rc == 0), (rc, err)
    else:
        assert rc == 0, (rc, err)
        if file != "study/results.jsonl":
            assert blocks == record_world["blocks"], err


@pytest.mark.parametrize("seed", range(24))
def test_a_damaged_suite_piece_is_merged_right_or_refused_in_one_line(seed: int, record_world: dict[str, Any],
                                                                      tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    piece = tmp_path / "piece"
    shutil.copytree(record_world["piece"], piece)
    f = piece / "suite.json"
    f.write_bytes(damage(f.read_bytes(), seed))
    out = tmp_path / "merged"
    rc, _, err = _call(["probe", "--suite", "--merge", str(piece), "--out", str(out), "--format", "json"], capsys)
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("sanlab: error: "), err
        assert not out.exists()
        return
    assert _object(f.read_bytes()), err
    given = json.loads(f.read_text())
    merged = json.loads((out / "suite.json").read_text())
    tasks = set(given["tasks"])
    from sanlab.probes.layout import task_of

    assert sorted(c["key"] for c in merged["cells"]) == sorted(c["key"] for c in given["cells"] if task_of(c) in tasks)
