"""Study specs: validation, one-line errors with exit code 2 before any run, `study plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.errors import ConfigError
from sanlab.study.plan import plan_study
from sanlab.study.spec import StudySpec, load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return p


BASE = """
name = "t"
[data]
dir = "{data}"
seq_len = 32
[model]
d_model = 32
n_layers = 5
n_heads = 4
n_kv_heads = 2
vocab_size = 512
"""


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("sanlab: error:")
    return err


@pytest.mark.parametrize("name", ["quick.toml", "paper.toml"])
def test_examples_validate(name: str) -> None:
    spec = load_spec(EXAMPLES / name)
    assert spec.optimizers and spec.seeds


def test_paper_example_is_the_paper_protocol() -> None:
    spec = load_spec(EXAMPLES / "paper.toml")
    assert (spec.model.n_layers, spec.model.d_model, spec.model.vocab_size) == (20, 512, 16384)
    assert spec.data.seq_len == 2048 and spec.train.batch_rows == 512
    assert spec.sweep.tokens == 5_000_000_000 and max(spec.final.tokens) == 105_000_000_000
    assert len(spec.seeds) == 3 and spec.sweep.multipliers == [0.5, 1.0, 2.0]
    arms = {a.name: a for a in plan_study(spec).arms}
    # SPEC §1.2 Table 1.
    assert round(arms["san"].params_total / 1e6, 2) == 24.13 and arms["iso_param"].model.n_layers == 4
    assert round(arms["san"].params_non_embedding / 1e6, 2) == 15.74
    assert arms["iso_flop"].model.n_layers == 9 and arms["iso_depth"].model.n_layers == 20


def test_token_counts_read_like_the_paper() -> None:
    spec = StudySpec.model_validate({"data": {"dir": "x"}, "sweep": {"tokens": "5B"},
                                     "final": {"tokens": ["30B", "2.5M", 1000]}})
    assert spec.sweep.tokens == 5 * 10**9 and spec.final.tokens == [30 * 10**9, 2_500_000, 1000]


@pytest.mark.parametrize("extra, key", [
    ("[sweep]\nmultiplers = [1]\n", "sweep.multiplers: unknown key"),
    ("[train]\ntokens = 100\n", "train.tokens is set per run"),
    ("[optim]\nlr = 0.1\n", "optim.lr is set per run"),
    ("[sweep]\ntokens = 'lots'\n", "sweep.tokens"),
    ("[runner]\nworkers = 0\n", "runner.workers must be positive"),
    ("[noise]\noptimizer = 'adamw'\n", "noise.optimizer=adamw is not one of optimizers"),
])
def test_bad_spec_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             extra: str, key: str) -> None:
    spec = write(tmp_path, BASE.format(data=tmp_path) + extra)
    err = one_error_line(capsys, ["study", "run", str(spec), "--out", str(tmp_path / "out")])
    assert key in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, words", [
    (["model.n_layers=4"], "no FFN partner with at most"),  # 4 SAN layers < 1 FFN layer
    (["matching.policy=nearest", "matching.tolerance=0.001"], "beyond the tolerance"),
])
def test_impossible_matching_exits_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    overrides: list[str], words: str) -> None:
    spec = str(write(tmp_path, BASE.format(data=tmp_path)))
    err = one_error_line(capsys, ["study", "run", spec, *overrides, "--out", str(tmp_path / "out")])
    assert words in err
    assert not (tmp_path / "out").exists()
    assert words in one_error_line(capsys, ["study", "plan", spec, *overrides])


def test_missing_data_dir_exits_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, BASE.format(data=tmp_path / "nope"))
    err = one_error_line(capsys, ["study", "run", str(spec), "--out", str(tmp_path / "out")])
    assert "data.dir" in err and "nope" in err
    assert not (tmp_path / "out").exists()


def test_missing_spec_file_and_study_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "not found" in one_error_line(capsys, ["study", "plan", str(tmp_path / "x.toml")])
    assert "not a study dir" in one_error_line(capsys, ["study", "status", str(tmp_path)])


def test_override_on_the_command_line(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE.format(data=tmp_path)), ["sweep.extend=false", "seeds=[1,2,3]"])
    assert spec.sweep.extend is False and spec.seeds == [1, 2, 3]
    with pytest.raises(ConfigError, match="seeds"):
        load_spec(write(tmp_path, BASE.format(data=tmp_path)), ["seeds=[1,1]"])


def test_plan_json_lists_the_four_matched_arms(capsys: pytest.CaptureFixture[str]) -> None:
    from sanlab.accounting import count_flops, count_params

    assert main(["study", "plan", str(EXAMPLES / "quick.toml"), "--json", "--no-timing"]) == 0
    plan = json.loads(capsys.readouterr().out)
    arms = {a["name"]: a for a in plan["arms"]}
    assert list(arms) == ["san", "iso_param", "iso_flop", "iso_depth"]
    from sanlab.config import ModelConfig

    for a in arms.values():
        m = ModelConfig.model_validate(a["model"])
        assert a["params_non_embedding"] == count_params(m).non_embedding
        assert a["train_flops_per_token"] == count_flops(m, 128).train
    assert arms["iso_depth"]["model"]["n_layers"] == arms["san"]["model"]["n_layers"]
    assert all(arms[k]["model"]["state_mixer"] == "swiglu" for k in ("iso_param", "iso_flop", "iso_depth"))
    runs = plan["runs"]
    assert len({r["run_id"] for r in runs}) == len(runs)
    phases = {p for r in runs for p in r["phases"]}
    assert phases == {"sweep", "final", "noise"}
    assert any(r["arm"] == "san_rms" for r in runs)
    assert plan["total_flops"] == sum(r["flops"] for r in runs) and plan["est_seconds"] > 0


def test_plan_table_prints_runs_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "plan", str(EXAMPLES / "quick.toml")]) == 0
    out = capsys.readouterr().out
    assert "san-L5-d64-muon-lr0.08-120K-s1" in out and "total:" in out and "boundary extension" in out
    assert "timed on this machine" in " ".join(out.split())  # the local runner times each arm's step


def test_identical_trainings_share_one_run(tmp_path: Path) -> None:
    """A sweep point at a final budget and the zcrms half of the noise pair are reused."""
    spec = load_spec(write(tmp_path, BASE.format(data=tmp_path)),
                     ["sweep.tokens=1000", "final.tokens=[1000]", "seeds=[42]"])
    runs = {r.run_id: r for r in plan_study(spec).runs}
    shared = runs["san-L5-d32-muon-lr0.02-1K-s42"]
    assert shared.phases == ["sweep", "final", "noise"]


def test_plan_counts_the_runs_boundary_extension_may_add(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each cell can extend `max_extensions` times until its sweep is done: the quick study's
    4 cells × 2 = 8 more runs at most, beside its 22 planned ones; with results, a cell whose
    curve turned adds none and one whose next point is planned has one fewer left."""
    assert main(["study", "plan", str(EXAMPLES / "quick.toml"), "--json", "--no-timing"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["runs"]) == 22 and plan["max_extension_runs"] == 8
    assert main(["study", "plan", str(EXAMPLES / "quick.toml"), "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "22 runs + up to 8 sweep extensions" in out
    assert "total: 22 runs + up to 8 sweep extensions," in out

    spec = load_spec(write(tmp_path, BASE.format(data=tmp_path)), ["sweep.max_extensions=3"])
    arms = plan_study(spec).arms
    assert len(arms) == 4 and plan_study(spec).max_extension_runs == 4 * 3

    def rec(arm: str, m: float, loss: float) -> dict:
        return {"arm": arm, "optimizer": "muon", "phases": ["sweep"], "multiplier": m, "tokens": spec.sweep.tokens,
                "seed": spec.sweep_seed, "status": "completed", "final": {"val_loss": loss}}

    records = {f"{a}-{m}": rec(a, m, loss) for a, curve in
               (("san", {0.5: 3.0, 1.0: 2.9, 2.0: 3.1}),  # turned: done, no extension
                ("iso_param", {0.5: 3.0, 1.0: 2.9, 2.0: 2.8}))  # best at the top edge: ×4 planned next
               for m, loss in curve.items()}
    p = plan_study(spec, None, records)
    assert p.extension_room.get(("san", "muon"), 0) == 0
    assert p.extension_room[("iso_param", "muon")] == 3 - 1
    assert any(r.arm == "iso_param" and r.note == "boundary extension" for r in p.runs)
    assert p.max_extension_runs == 0 + 2 + 3 + 3
