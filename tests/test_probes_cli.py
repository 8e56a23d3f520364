"""`sanlab probe`: end to end on tiny models, the capacity arithmetic, and bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from probe_helpers import InProcessRunner, use_in_process_runner

from sanlab.cli import main
from sanlab.config import ModelConfig
from sanlab.errors import ConfigError
from sanlab.model.lm import LM
from sanlab.probes.capacity import bits, capacity, trainable_from_meta, trainable_params

TINY = ["model.d_model=16", "model.n_heads=2", "model.n_kv_heads=1", "train.steps=3", "train.batch_rows=4",
        "row_tokens=64", "sweep.grid=[1]", "sweep.max_extensions=0"]


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> type[InProcessRunner]:
    return use_in_process_runner(monkeypatch)


def _probe(tmp_path: Path, *items: str) -> int:
    return main(["probe", *items, "--out", str(tmp_path / "out")])


# --------------------------------------------------------------------------- end to end


def test_one_task_trains_scores_and_writes_results(tmp_path: Path, in_process: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc = _probe(tmp_path, "retrieval", "--arms", "standard,san", *TINY,
                "task.n_train=40", "task.n_val=8", "task.n_test=12")
    assert rc == 0
    out = capsys.readouterr().out
    assert "retrieval/standard" in out and "retrieval/san" in out
    res = json.loads((tmp_path / "out" / "probe-retrieval.json").read_text())
    assert [a["name"] for a in res["arms"]] == ["standard", "san"]
    for cell in res["cells"]:
        assert cell["test_total"] == 12 and 0 <= cell["test_correct"] <= 12
        assert cell["test_accuracy"] == cell["test_correct"] / 12
        run = tmp_path / "out" / cell["points"][0]["run_dir"]
        assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "latest").is_dir()
        scored = json.loads((run / "probe.json").read_text())
        assert scored["test_correct"] == cell["test_correct"]
    # the SAN arm has no FFN: fewer trainable parameters
    std, san = res["cells"]
    assert san["trainable_params"] < std["trainable_params"]
    rows = list(csv.DictReader((tmp_path / "out" / "probe-retrieval.csv").open()))
    assert [r["arm"] for r in rows] == ["standard", "san"] and rows[0]["paper"] == "100.0"
    # A rerun reuses the finished runs (the trainer returns them as they are).
    first = [json.loads((tmp_path / "out" / c["points"][0]["run_dir"] / "meta.json").read_text())["finished_at"]
             for c in res["cells"]]
    assert _probe(tmp_path, "retrieval", "--arms", "standard,san", *TINY,
                  "task.n_train=40", "task.n_val=8", "task.n_test=12") == 0
    again = [json.loads((tmp_path / "out" / c["points"][0]["run_dir"] / "meta.json").read_text())["finished_at"]
             for c in res["cells"]]
    assert again == first
    # Each point's wall time is its run's (meta.json), the same when reused, not the reuse's.
    metas = [json.loads((tmp_path / "out" / c["points"][0]["run_dir"] / "meta.json").read_text()) for c in res["cells"]]
    reran = json.loads((tmp_path / "out" / "probe-retrieval.json").read_text())
    for cell, rerun_cell, meta in zip(res["cells"], reran["cells"], metas, strict=True):
        assert cell["points"][0]["wall_s"] == rerun_cell["points"][0]["wall_s"] == meta["wall_time_s"] > 0


def test_a_cells_sweep_points_train_as_members_with_the_solo_results(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With the local runner's grouping (runner.members "auto", one worker), a cell's three
    sweep points train as the members of one model: each point's run dir is an ordinary
    scored run (probe.json; meta.json says it trained in a batch of 3), and the probe's
    results (every point's losses and accuracies, the selected LR) equal the same suite's
    with every point trained solo, value for value."""
    from probe_helpers import use_grouping_runner

    items = ["modadd", "--arms", "standard", *TINY[:-2], "sweep.grid=[0.5,1,2]", "sweep.max_extensions=0",
             "task.p=7", "runner.workers=1"]
    runner = use_grouping_runner(monkeypatch)
    assert main(["probe", *items, "--out", str(tmp_path / "members")]) == 0
    assert [len(g) for g in runner.groups] == [3]
    use_in_process_runner(monkeypatch)
    assert main(["probe", *items, "--out", str(tmp_path / "solo")]) == 0
    grouped, solo = (json.loads((tmp_path / d / "probe-modadd.json").read_text())["cells"] for d in ("members", "solo"))
    keys = ("multiplier", "lr", "status", "val_accuracy", "test_accuracy", "test_correct", "val_loss")
    assert [[p[k] for k in keys] for p in grouped[0]["points"]] == [[p[k] for k in keys] for p in solo[0]["points"]]
    assert grouped[0]["test_accuracy"] == solo[0]["test_accuracy"] and grouped[0]["lr"] == solo[0]["lr"]
    for p in grouped[0]["points"]:
        run = tmp_path / "members" / p["run_dir"]
        assert json.loads((run / "meta.json").read_text())["members"]["batch"] == 3
        assert json.loads((run / "probe.json").read_text())["test_correct"] == p["test_correct"]
        assert p["wall_s"] == json.loads((run / "meta.json").read_text())["wall_time_s"] > 0


def test_each_cell_sweeps_with_boundary_extension(tmp_path: Path, in_process: Any) -> None:
    items = [i for i in TINY if not i.startswith("sweep.")]
    assert _probe(tmp_path, "modadd", "--arms", "standard", *items, "task.p=5", "task.train_frac=0.8",
                  "sweep.grid=[1,2]", "sweep.max_extensions=1") == 0
    cell = json.loads((tmp_path / "out" / "probe-modadd.json").read_text())["cells"][0]
    mults = sorted(p["multiplier"] for p in cell["points"])
    # With two points the best is always at an edge: exactly one extension beyond it.
    assert mults in ([0.5, 1.0, 2.0], [1.0, 2.0, 4.0])
    assert sorted(p["lr"] for p in cell["points"]) == pytest.approx([0.02 * m for m in mults])
    assert cell["multiplier"] in mults


def test_capacity_reports_memorised_bits_over_trainable_params(tmp_path: Path, in_process: Any) -> None:
    assert _probe(tmp_path, "capacity", "--arms", "standard", *TINY, "capacity.ns=[16,32]",
                  "task.alphabet=4", "train.steps=30", "optim.lr=1e-2") == 0
    res = json.loads((tmp_path / "out" / "probe-capacity.json").read_text())
    cap = res["capacity"]["standard"]
    by_n = {}
    for cell in res["cells"]:
        best = next(p for p in cell["points"] if p["multiplier"] == cell["multiplier"])
        scored = json.loads((tmp_path / "out" / best["run_dir"] / "probe.json").read_text())
        meta = json.loads((tmp_path / "out" / best["run_dir"] / "meta.json").read_text())
        by_n[cell["task_config"]["n_train"]] = (scored["test_correct"], trainable_from_meta(meta))
        assert scored["test_total"] == cell["task_config"]["n_train"]  # scored on the training set
    params = {p for _, p in by_n.values()}
    assert len(params) == 1
    best_bits = max(c for c, _ in by_n.values()) * 2.0  # log2(4) = 2 bits a label
    assert cap["bits_per_param"] == pytest.approx(best_bits / params.pop())
    assert res["table"]["standard"]["capacity"] == cap["bits_per_param"]


def _rescored(out: Path, cell: dict[str, Any], split: str = "test") -> dict[str, Any]:
    """The accuracy of a cell's selected run, computed again from its checkpoint and data."""
    from sanlab.analysis.rundir import RunDir
    from sanlab.probes.evaluate import accuracy

    best = next(p for p in cell["points"] if p["multiplier"] == cell["multiplier"])
    run = RunDir.open(out / best["run_dir"])
    return accuracy(run.load_model("latest"), run.data_dir(), split)


def test_a_task_runs_from_a_working_directory_with_a_relative_out(
        tmp_path: Path, in_process: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs train with their run dir as the working directory: nothing the probe writes
    into a run's config may be relative to where the command was started."""
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "retrieval", "--arms", "standard", *TINY, "task.n_train=40", "task.n_val=8",
                 "task.n_test=12", "--out", "rel/out"]) == 0
    out = tmp_path / "rel" / "out"
    res = json.loads((out / "probe-retrieval.json").read_text())
    cell = res["cells"][0]
    assert cell["points"][0]["status"] == "completed"
    run = out / cell["points"][0]["run_dir"]
    cfg = json.loads((run / "config.json").read_text())
    data = out / "data" / Path(cfg["data"]["dir"]).name
    assert cfg["data"]["dir"] == os.path.join("..", "..", "data", data.name)  # relative to the run dir
    assert (run / cfg["data"]["dir"]).resolve() == data.resolve() and (data / "manifest.json").is_file()
    # the numbers: the test split's exact matches at the selected LR, recomputed from the checkpoint
    monkeypatch.chdir(tmp_path / "rel")  # and from another working directory
    again = _rescored(out, cell)
    assert (cell["test_correct"], cell["test_total"]) == (again["correct"], again["total"]) == \
        (cell["test_correct"], 12)
    assert cell["test_accuracy"] == again["correct"] / 12 == res["table"]["standard"]["retrieval"] / 100


def test_the_default_out_is_under_the_working_directory(tmp_path: Path, in_process: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "dyck", "--arms", "standard", *TINY, "task.n_train=20", "task.n_val=4",
                 "task.n_test=4", "task.max_len=8"]) == 0
    res = json.loads((tmp_path / "runs" / "probe" / "probe-dyck.json").read_text())
    cell = res["cells"][0]
    assert cell["points"][0]["status"] == "completed"
    assert cell["test_correct"] == _rescored(tmp_path / "runs" / "probe", cell)["correct"]


def test_the_quick_suite_runs_from_a_working_directory_with_a_relative_out(
        tmp_path: Path, in_process: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "--suite", "--quick", "--arms", "standard", *TINY, "task.n_train=40", "task.n_val=8",
                 "task.n_test=8", "capacity.ns=[32]", "--out", "suite"]) == 0
    out = tmp_path / "suite"
    res = json.loads((out / "suite.json").read_text())
    assert res["quick"] is True and not res.get("unscored")
    for cell in res["cells"]:
        assert {p["status"] for p in cell["points"]} == {"completed"}, cell["key"]
        scored = json.loads((out / cell["points"][0]["run_dir"] / "probe.json").read_text())
        assert (scored["test_correct"], scored["test_total"]) == (cell["test_correct"], cell["test_total"])
        assert cell["test_accuracy"] == cell["test_correct"] / cell["test_total"]
    by_key = {c["key"]: c for c in res["cells"]}
    for task in ("addition", "modadd", "retrieval", "induction", "dyck", "sentiment"):
        assert res["table"]["standard"][task] == pytest.approx(100 * by_key[f"{task}/standard"]["test_accuracy"])
    cap = res["capacity"]["standard"]
    mem = by_key["capacity-n32/standard"]
    assert cap["memorised"] == mem["test_correct"] and cap["n"] == 32 == mem["test_total"]
    assert cap["bits_per_param"] == pytest.approx(mem["test_correct"] * math.log2(16) / mem["trainable_params"])
    assert by_key["retrieval/standard"]["test_correct"] == _rescored(out, by_key["retrieval/standard"])["correct"]


def test_a_suite_of_some_tasks_reuses_the_single_task_runs(tmp_path: Path, in_process: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`--suite --tasks` runs those tasks only, in SPEC §2's column order, and a cell that
    a single-task run already trained (same --out) is reused, not trained again."""
    monkeypatch.chdir(tmp_path)
    small = [*TINY, "task.n_train=40", "task.n_val=8", "task.n_test=8"]
    assert main(["probe", "dyck", "--arms", "standard", *small, "--out", "o"]) == 0
    dyck_first = json.loads((tmp_path / "o" / "probe-dyck.json").read_text())["cells"][0]
    metrics = tmp_path / "o" / dyck_first["points"][0]["run_dir"] / "metrics.jsonl"
    before = metrics.read_bytes()
    assert main(["probe", "--suite", "--tasks", "dyck,addition", "--arms", "standard", *small, "--out", "o"]) == 0
    res = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert res["tasks"] == ["addition", "dyck"] and [c["key"] for c in res["cells"]] == [
        "addition/standard", "dyck/standard"]
    dyck = res["cells"][1]
    assert dyck["points"][0]["run_dir"] == dyck_first["points"][0]["run_dir"]
    assert metrics.read_bytes() == before  # the finished run came back as it was, not retrained
    assert dyck["test_correct"] == dyck_first["test_correct"]
    assert set(res["table"]["standard"]) == {"addition", "dyck"}


def test_a_suite_of_other_tasks_adds_its_columns_to_the_dirs_suite(tmp_path: Path, in_process: Any,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--suite --tasks B` into a dir whose suite.json has task A keeps A's cells as they
    were (their run files need not be there: a merged record's are not), and a suite of
    other arms replaces it, saying so."""
    monkeypatch.chdir(tmp_path)
    small = [*TINY, "task.n_train=40", "task.n_val=8", "task.n_test=8"]
    assert main(["probe", "--suite", "--tasks", "dyck", "--arms", "standard", *small, "--out", "o"]) == 0
    first = json.loads((tmp_path / "o" / "suite.json").read_text())
    shutil.rmtree(tmp_path / "o" / "runs")  # as in a record whose run files were lost
    assert main(["probe", "--suite", "--tasks", "addition", "--arms", "standard", *small, "--out", "o"]) == 0
    res = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert res["tasks"] == ["addition", "dyck"]
    assert [c["key"] for c in res["cells"]] == ["addition/standard", "dyck/standard"]
    assert res["cells"][1] == first["cells"][0]
    assert res["table"]["standard"]["dyck"] == pytest.approx(100 * first["cells"][0]["test_accuracy"])
    printed = capsys.readouterr()
    assert "o/suite.json keeps dyck from before" in printed.out + printed.err
    assert main(["probe", "--suite", "--tasks", "addition", "--arms", "san", *small, "--out", "o"]) == 0
    res = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert res["tasks"] == ["addition"] and [a["name"] for a in res["arms"]] == ["san"]
    printed = capsys.readouterr()
    assert "o/suite.json: its arms (standard) are not this suite's" in printed.out + printed.err


def test_a_suite_of_other_tasks_keeps_the_dirs_capacity_column(tmp_path: Path, in_process: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The capacity column's cells are task `memorize` cells keyed `capacity-nN/ARM`:
    `--suite --tasks dyck` into a suite's dir keeps them as they were, and the column's
    number (max over N of memorised · log2 A / trainable params) is the one from before."""
    monkeypatch.chdir(tmp_path)
    small = [*TINY, "task.n_val=8", "task.n_test=8"]
    assert main(["probe", "--suite", "--tasks", "capacity", "--arms", "standard", *small, "capacity.ns=[16]",
                 "task.alphabet=4", "--out", "o"]) == 0
    first = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert [(c["key"], c["task"]) for c in first["cells"]] == [("capacity-n16/standard", "memorize")]
    shutil.rmtree(tmp_path / "o" / "runs")  # a record's lost run files: the cells cannot be gathered again
    assert main(["probe", "--suite", "--tasks", "dyck", "--arms", "standard", *small, "task.n_train=40",
                 "--out", "o"]) == 0
    res = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert res["tasks"] == ["capacity", "dyck"]
    assert res["cells"][0] == first["cells"][0]
    cell = first["cells"][0]
    expected = cell["test_correct"] * 2.0 / cell["trainable_params"]  # log2(4) bits a label
    assert res["table"]["standard"]["capacity"] == pytest.approx(expected)
    assert res["capacity"]["standard"]["points"] == [{"n": 16, "memorised": cell["test_correct"]}]
    rows = [r.split(",") for r in (tmp_path / "o" / "suite.csv").read_text().splitlines()]
    assert [r[2:4] for r in rows[1:]] == [["capacity", "bits_per_param"], ["capacity", "bits_per_param_fano"],
                                          ["dyck", "test_accuracy_pct"]]
    assert float(rows[1][4]) == pytest.approx(expected, rel=1e-5)


# --------------------------------------------------------------------------- capacity arithmetic


def test_trainable_params_of_a_tiny_model_by_hand_and_without_frozen_ones() -> None:
    model = LM(ModelConfig(d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn=True))
    d, kv = 8, 4  # kv = n_kv_heads * head_dim
    attn = d * d + 2 * d * kv + d * d + 2 * 4 + d + 1  # wq wk wv wo, q/k norm gains, attn norm, gate
    ffn = 3 * d * 4 * d + d + 1  # gate up down, ffn norm, gate
    expected = 16 * d + attn + ffn + d  # tied embedding once, final norm
    assert trainable_params(model) == expected == 1122
    for name in ("blocks.0.attn.wq.weight", "blocks.0.attn.wk.weight"):
        model.get_parameter(name).requires_grad_(False)
    assert trainable_params(model) == expected - d * d - d * kv
    from sanlab.train.optim import routing_table

    meta = {"routing": {g: v["numel"] for g, v in routing_table(model).items()}}
    assert trainable_from_meta(meta) == expected - d * d - d * kv


def test_capacity_is_the_best_point_of_the_sweep() -> None:
    points = [{"n": 100, "memorised": 90}, {"n": 400, "memorised": 200}, {"n": 1600, "memorised": 150},
              {"n": 3200, "memorised": None}]
    cap = capacity(points, alphabet=16, params=1000)
    assert cap["n"] == 400 and cap["memorised"] == 200
    assert cap["bits"] == 800 and cap["bits_per_param"] == pytest.approx(0.8)
    assert bits(3, 5) == pytest.approx(3 * math.log2(5))
    assert capacity([{"n": 4, "memorised": None}], 2, 10)["bits_per_param"] is None
    with pytest.raises(ValueError):
        capacity(points, 16, 0)
    with pytest.raises(ValueError):
        capacity(points, 1, 1000)


def test_capacity_on_a_tie_is_reported_at_the_smaller_n_in_any_order() -> None:
    """docs/commands/probe.md: two N with the same bits report the smaller N (the maximum is
    reached there already), whatever order the sweep's points come in (a merge, --tasks)."""
    pts = [{"n": 256, "memorised": 200}, {"n": 1024, "memorised": 200}, {"n": 4096, "memorised": 150}]
    for order in (pts, pts[::-1], [pts[1], pts[2], pts[0]]):
        cap = capacity(order, alphabet=16, params=1000)
        assert (cap["n"], cap["memorised"], cap["bits"]) == (256, 200, 800)
        assert cap["chance"] == pytest.approx(256 / 16) and cap["lower_bound"] is False
    zero = [{"n": 1024, "memorised": 256}, {"n": 64, "memorised": 16}]  # Fano: both at chance, 0 bits each
    assert capacity(zero, 4, 100, measure="fano")["n"] == 64


def test_fano_bits_are_the_symmetric_channel_information_and_give_chance_nothing() -> None:
    from sanlab.probes.capacity import fano_bits

    # a = 0.75, A = 4: log2 4 − H2(0.75) − 0.25·log2 3 = 2 − 0.811278 − 0.396241 = 0.792481 bits a label
    h2 = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    assert fano_bits(300, 400, 4) == pytest.approx(400 * (2 - h2 - 0.25 * math.log2(3)), rel=1e-12)
    assert fano_bits(300, 400, 4) == pytest.approx(400 * 0.7924812503605781, rel=1e-9)
    assert fano_bits(400, 400, 4) == pytest.approx(800.0)  # everything: N·log2 A
    assert fano_bits(100, 400, 4) == 0.0 and fano_bits(40, 400, 4) == 0.0  # chance and below: nothing
    assert fano_bits(0, 0, 4) == 0.0
    # the count credits a model at chance with N/A labels; Fano does not
    pts = [{"n": 65536, "memorised": 65536 // 16}]
    assert capacity(pts, 16, 2300)["bits_per_param"] == pytest.approx(65536 / 16 * 4 / 2300)
    assert capacity(pts, 16, 2300, measure="fano")["bits_per_param"] == 0.0
    # the best point can differ between the two: a small N nearly memorised beats a large N near chance
    pts = [{"n": 1000, "memorised": 900}, {"n": 16000, "memorised": 1500}]
    count, fano = capacity(pts, 16, 1000), capacity(pts, 16, 1000, measure="fano")
    assert count["n"] == 16000 and count["bits"] == pytest.approx(6000)
    assert fano["n"] == 1000 and fano["bits"] == pytest.approx(fano_bits(900, 1000, 16))
    assert fano["measure"] == "fano" and count["measure"] == "count"
    with pytest.raises(ValueError, match="measure"):
        capacity(pts, 16, 1000, measure="loss")


def test_capacity_says_when_it_is_only_a_lower_bound_and_what_chance_scores() -> None:
    # Not every pair of the best N memorised: the model hit its limit; chance = N / alphabet.
    cap = capacity([{"n": 100, "memorised": 90}, {"n": 400, "memorised": 200}], alphabet=16, params=1000)
    assert cap["lower_bound"] is False and cap["chance"] == pytest.approx(400 / 16)
    # Every pair of the best (largest) N memorised: a larger N could give more bits.
    cap = capacity([{"n": 100, "memorised": 100}, {"n": 400, "memorised": 400}], alphabet=4, params=1000)
    assert cap["lower_bound"] is True and cap["n"] == 400 and cap["chance"] == pytest.approx(100)
    from rich.console import Console

    from sanlab.probes.suite import print_table

    res = {"tasks": ["capacity"], "arms": [{"name": "standard", "label": "Standard", "overrides": []}],
           "table": {"standard": {"capacity": cap["bits_per_param"]}}, "anchors": {}, "cells": [],
           "capacity": {"standard": {**cap, "alphabet": 4, "points": [{"n": 400, "memorised": 400}]}}}
    console = Console(record=True, width=200)
    print_table(res, console)
    text = console.export_text()
    assert "≥0.80" in text and "a lower bound" in text


def test_capacity_model_overrides_reach_only_the_capacity_cells(tmp_path: Path) -> None:
    from sanlab.probes.arms import resolve_arms
    from sanlab.probes.runner import Overrides
    from sanlab.probes.suite import build_cells

    ov = Overrides.parse(['capacity.model=["model.d_model=16"]', "capacity.ns=[32]", "task.alphabet=4"])
    opts = ov.options_model(quick=True)
    assert opts.capacity.ns == [32] and opts.capacity.model == ["model.d_model=16"]  # user beats --quick
    cells = build_cells(["capacity", "dyck"], resolve_arms(["standard"]), Overrides.parse([]), opts, True,
                        tmp_path)
    by_key = {c.key: c for c in cells}
    assert by_key["capacity-n32/standard"].config.model.d_model == 16
    assert by_key["dyck/standard"].config.model.d_model == 64
    with pytest.raises(ConfigError, match="capacity.model"):
        Overrides.parse(['capacity.model=["d_model=16"]']).options_model()


def test_full_budget_capacity_cells_train_a_d16_model_and_every_other_task_keeps_d64(tmp_path: Path) -> None:
    """The documented default (docs/commands/probe.md, "Capacity: the model size"): at
    d_model 16 the standard arm has 8,548 trainable parameters, so the paper's 2.98
    bits/param is ~6,400 labels of log2(16) bits, inside the grid's 4096..16384; an arm's
    or the user's model.* still wins, and capacity.model=[] keeps d_model 64."""
    from sanlab.probes.arms import resolve_arms
    from sanlab.probes.capacity import trainable_params
    from sanlab.probes.runner import Overrides
    from sanlab.probes.suite import build_cells
    from sanlab.model.lm import LM

    ov = Overrides.parse([])
    opts = ov.options_model(quick=False)
    assert opts.capacity.ns == [4096, 16384, 65536]
    cells = build_cells(["capacity", "dyck"], resolve_arms(["standard", "san"]), ov, opts, False, tmp_path)
    by_key = {c.key: c for c in cells}
    assert {by_key[f"capacity-n{n}/standard"].config.model.d_model for n in opts.capacity.ns} == {16}
    assert by_key["capacity-n4096/standard"].config.train.steps == 3000
    assert by_key["dyck/standard"].config.model.d_model == 64
    params = trainable_params(LM(by_key["capacity-n4096/standard"].config.model))
    assert params == 8548 and 4096 < params * 2.98 / math.log2(16) < 16384
    assert trainable_params(LM(by_key["capacity-n4096/san"].config.model)) == 2370
    # the user's model.* wins over the capacity model; capacity.model=[] drops it
    for items, d in ((["model.d_model=32"], 32), (["capacity.model=[]"], 64)):
        ov = Overrides.parse([*items, "capacity.ns=[4096]"])
        (cell,) = build_cells(["capacity"], resolve_arms(["standard"]), ov, ov.options_model(quick=False), False,
                              tmp_path / str(d))
        assert cell.config.model.d_model == d


def test_full_size_retrieval_trains_at_64_rows_a_step_and_quick_keeps_8() -> None:
    """The documented defaults (docs/commands/probe.md, "Retrieval at the full size")."""
    from sanlab.probes.runner import BASE_OVERRIDES, task_settings

    cfg, items = task_settings("retrieval", False, [])
    assert (cfg.m_max, cfg.keys, cfg.values, cfg.n_train) == (16, 24, 24, 50000)
    assert items == ["train.batch_rows=64", "train.steps=1000"]
    cfg, items = task_settings("retrieval", True, [])
    assert (cfg.m_max, cfg.keys, cfg.values) == (8, 16, 16) and items == ["train.steps=500"]
    assert "train.batch_rows=8" in BASE_OVERRIDES  # every other task


def test_accuracy_is_exact_match_over_every_answer_token(tmp_path: Path) -> None:
    """A model that predicts all but the last answer digit right scores zero."""
    from sanlab.data.probes import TASKS, task_config, write_probe_dir
    from sanlab.probes.evaluate import accuracy

    cfg = task_config("addition", ["digits=2", "n_train=20", "n_val=5", "n_test=7"])
    write_probe_dir(TASKS["addition"], cfg, tmp_path / "a", row_tokens=64)

    class Oracle(torch.nn.Module):
        def __init__(self, spoil_last: bool) -> None:
            super().__init__()
            self.spoil_last = spoil_last
            self.rows: Any = None

        def forward(self, inputs: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
            # next token = the actual next token in the row (perfect), optionally wrong at EOS-1
            nxt = torch.roll(inputs, -1, dims=1)
            nxt[:, -1] = 1
            nxt[inputs == 1] = 2
            if self.spoil_last:
                nxt[torch.roll(nxt, -1, dims=1) == 1] = 8
            return torch.nn.functional.one_hot(nxt, 24).float()

    assert accuracy(Oracle(False), tmp_path / "a", "test") == {"correct": 7, "total": 7, "accuracy": 1.0}
    assert accuracy(Oracle(True), tmp_path / "a", "test")["correct"] == 0


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("items, message", [
    (["nosuchtask"], "unknown probe task 'nosuchtask'"),
    (["retrieval", "--arms", "standard,bogus"], "unknown arm 'bogus'"),
    (["retrieval", "--arm", "odd: model.mixer=nosuch"], "arm odd: variant not available"),
    (["modadd", "task.p=1"], "p must be at least 2"),
    (["retrieval", "task.m_max=30"], "key space has only 24"),
    (["memorize", "task.alphabet=1"], "alphabet must be at least 2"),
    (["capacity", "task.alphabet=1"], "alphabet must be at least 2"),
    (["retrieval", "data.dir=/x"], "data.* is not settable"),
    (["retrieval", "foo.bar=1"], "unknown section 'foo'"),
    (["retrieval", "model.nope=1"], "unknown key model.nope"),
    (["retrieval", "sweep.grid=[0]"], "positive multipliers"),
    (["retrieval", "--suite"], "--suite runs every task"),
    (["--suite", "--tasks", "dyck,nosuch"], "--tasks: unknown suite task 'nosuch'"),
    (["--suite", "--tasks", ","], "--tasks: give at least one task"),
    (["dyck", "--tasks", "dyck"], "--tasks goes with --suite"),
    ([], "give a TASK"),
    (["retrieval", "--arm", "x"], "expected 'NAME: section.key=value"),
    (["retrieval", "--arms", "standard,standard"], "given twice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, items: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str], in_process: Any) -> None:
    assert _probe(tmp_path, *items) == 2
    err = capsys.readouterr().err
    assert err.startswith("sanlab: error: ") and message in err and err.count("\n") == 1, err
    assert not in_process.calls


def test_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["probe", "retrieval", "--out", str(tmp_path / "file")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_custom_arm_and_listing(tmp_path: Path, in_process: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "retrieval" in listing and "frozen_qk" in listing and "mixit" in listing
    from sanlab.probes.arms import PRESETS, Arm, unavailable

    assert [n for n, o in PRESETS.items() if unavailable(Arm(n, o))] == []  # every SPEC §2 arm runs
    assert _probe(tmp_path, "dyck", "--arm", "wide: model.ffn=true model.d_ff=40", *TINY,
                  "task.n_train=20", "task.n_val=4", "task.n_test=4", "task.max_len=8") == 0
    res = json.loads((tmp_path / "out" / "probe-dyck.json").read_text())
    cfg = json.loads((tmp_path / "out" / res["cells"][0]["points"][0]["run_dir"] / "config.json").read_text())
    assert cfg["model"]["d_ff"] == 40 and cfg["model"]["state_mixer"] == "swiglu" and cfg["model"]["n_layers"] == 2


def test_freeze_arms_come_from_the_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §2's Frozen-QK and Frozen-MLP are the specs' `probe_freeze` declarations, in the
    suite's column order, and a target a spec adds joins the presets without an edit to arms.py."""
    from sanlab.model.mixers.softmax import SoftmaxSpec
    from sanlab.probes import arms

    assert list(arms.PRESETS) == ["standard", "san", "frozen_qk", "frozen_mlp", "mixit"]
    assert arms.PRESETS["frozen_qk"] == ("model.ffn=true", 'train.freeze=["qk"]')
    assert arms.PRESETS["frozen_mlp"] == ("model.ffn=true", 'train.freeze=["mlp"]')
    assert (arms.LABELS["frozen_qk"], arms.LABELS["frozen_mlp"]) == ("Frozen-QK", "Frozen-MLP")
    monkeypatch.setattr(SoftmaxSpec, "probe_freeze", {**SoftmaxSpec.probe_freeze, "qk_proj": "Frozen-QK-proj"})
    presets = arms._presets()
    assert presets["frozen_qk_proj"] == ("Frozen-QK-proj", ("model.ffn=true", 'train.freeze=["qk_proj"]'))
    assert arms.unavailable(arms.Arm("frozen_qk_proj", presets["frozen_qk_proj"][1])) is None


def test_results_files_are_strict_json(tmp_path: Path) -> None:
    from sanlab.probes.suite import write_results

    res = {"tasks": ["retrieval"], "arms": [{"name": "standard", "label": "Standard"}],
           "table": {"standard": {"retrieval": float("nan")}}, "anchors": {}, "capacity": {},
           "cells": [{"arm": "standard", "key": "retrieval/standard", "val_loss": float("inf")}]}
    json_path, csv_path = write_results(res, tmp_path, "x")
    data = json.loads(json_path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert data["table"]["standard"]["retrieval"] is None and data["cells"][0]["val_loss"] is None
    assert csv_path.read_text().splitlines()[1].startswith("standard,Standard,retrieval,test_accuracy_pct,,")
