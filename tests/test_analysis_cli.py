"""`sanlab analyze` end to end on two really trained tiny runs, and its one-line errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from analysis_rundirs import write_run
from sanlab.cli import main
from sanlab.config import ModelConfig

TINY = ["model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=512"]
TRAIN = ["data.seq_len=64", "train.steps=12", "train.batch_rows=4", "train.eval_rows=4",
         "train.eval_every=0", "train.log_every=100", "train.device=cpu", "train.precision=fp32"]  # fmt: skip


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A prepared synth corpus and two short runs on it: a 2-layer SAN and a 1-layer FFN arm."""
    root = tmp_path_factory.mktemp("analysis")
    data = root / "data"
    assert main(["prepare", "--corpus", "synth", "--out", str(data), "--tokens", "30k",
                 "seq_len=64", "vocab_size=512", "val_frac=0.1"]) == 0  # fmt: skip
    for name, arch in (("san", ["model.n_layers=2"]), ("ffn", ["model.n_layers=1", "model.ffn=true"])):
        rc = main(["train", "--out", str(root / name), f"data.dir={data}", *TINY, *arch, *TRAIN])
        assert rc == 0, name
    return {"root": root, "data": data, "san": root / "san", "ffn": root / "ffn"}


def test_analyze_vs_region_deltas_sum_to_aggregate(trained: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    out = trained["root"] / "out"
    rc = main(["analyze", str(trained["san"]), "--vs", str(trained["ffn"]), "--out", str(out), "--eval-rows", "8"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "Δ = san − ffn by region" in printed and "Δ = san − ffn by exercise" in printed
    result = json.loads((out / "analysis.json").read_text())
    (cmp,) = result["comparisons"]
    for grouping in ("region", "exercise", "position", "frequency"):
        ident = cmp[grouping]["identity"]
        weighted = sum(r["weighted"] for r in cmp[grouping]["rows"])
        assert weighted == pytest.approx(ident["aggregate_delta"], rel=1e-9, abs=1e-12)
        assert ident["rel_error"] < 1e-6, grouping
    san, ffn = result["runs"]["san"]["losses"], result["runs"]["ffn"]["losses"]
    assert cmp["region"]["identity"]["aggregate_delta"] == pytest.approx(san["loss"] - ffn["loss"])
    assert {r["group"] for r in san["region"]} <= {"other", "query", "trace", "answer"}
    assert sum(r["token_share"] for r in san["exercise"]) == pytest.approx(1.0)
    # The synth data has an entropy floor: every region / type row shows it and the loss above it.
    assert result["sample"]["entropy_floor_file"].endswith("entropy_floor.json") and "above floor" in printed
    assert 0 < san["entropy_floor"] < san["loss"]
    for row in san["region"] + san["exercise"]:
        assert row["loss_above_floor"] == pytest.approx(row["loss"] - row["entropy_floor"])
    assert {r["group"]: r["entropy_floor"] for r in san["region"]}.get("other", 0) == 0
    assert all(r["entropy_floor"] > 0 for r in san["region"] if r["group"] == "query")
    for f in ("losses.csv", "deltas.csv", "delta_identity.csv", "attention_heads.csv", "stream.csv", "gates.csv"):
        assert (out / f).is_file(), f
    heads = result["runs"]["san"]["attention"]["heads"]
    assert len(heads) == 2 * 4 and all(0 <= h["sink"] <= 1 for h in heads)


def test_spectra_over_milestones_per_type_and_crystallisation(trained: dict[str, Path]) -> None:
    out = trained["root"] / "spectra"
    rc = main(["analyze", str(trained["ffn"]), "--out", str(out), "--skip", "losses,attention,stream"])
    assert rc == 0
    sp = json.loads((out / "analysis.json").read_text())["runs"]["ffn"]["spectra"]
    assert sorted({r["milestone"] for r in sp["per_type"]}) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [c["type"] for c in sp["crystallisation"]] == ["Q", "K", "V", "O", "gate", "up", "down"]
    assert all(len(c["distances"]) == 4 for c in sp["crystallisation"])
    assert (out / "spectra_by_type.csv").read_text().startswith("run,milestone,type,layers,stable_rank")
    assert (out / "crystallisation.csv").is_file()


def _error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1, err
    return err


def test_not_a_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    assert "not a run dir (no config.json)" in _error(capsys, ["analyze", str(tmp_path / "empty")])
    assert "run dir not found" in _error(capsys, ["analyze", str(tmp_path / "missing")])


def test_missing_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64)
    run = write_run(tmp_path / "run", cfg, {"milestone-000": lambda m: None})
    err = _error(capsys, ["analyze", str(run), "--skip", "spectra"])
    assert "no checkpoint 'latest' (available: milestone-000)" in err
    err = _error(capsys, ["analyze", str(run), "--checkpoint", "50", "--skip", "spectra"])
    assert "no checkpoint 'milestone-050'" in err
    only_latest = write_run(tmp_path / "run2", cfg)
    err = _error(capsys, ["analyze", str(only_latest), "--skip", "losses,attention,stream"])
    assert "no milestone checkpoints for spectra (available: latest)" in err


def test_checkpoint_that_does_not_match_config(tmp_path: Path, capsys: pytest.CaptureFixture, trained: dict[str, Path]) -> None:
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=512)
    run = write_run(tmp_path / "run", cfg, data_dir=trained["data"])
    config = json.loads((run / "config.json").read_text())
    config["model"]["n_layers"] = 2
    (run / "config.json").write_text(json.dumps(config))
    err = _error(capsys, ["analyze", str(run), "--skip", "spectra"])
    assert "does not match the run's config.json" in err


def test_mismatched_tokenizers(tmp_path: Path, capsys: pytest.CaptureFixture, trained: dict[str, Path]) -> None:
    other_vocab = write_run(
        tmp_path / "v1024", ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=1024)
    )
    err = _error(capsys, ["analyze", str(trained["san"]), "--vs", str(other_vocab), "--skip", "spectra"])
    assert "tokenizers differ" in err and "vocab 512" in err and "vocab 1024" in err

    data2 = tmp_path / "data2"
    shutil.copytree(trained["data"], data2)
    swap_two_tokens(data2)
    other_tok = write_run(
        tmp_path / "t", ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=512), data_dir=data2
    )
    err = _error(capsys, ["analyze", str(trained["san"]), "--vs", str(other_tok), "--skip", "spectra"])
    assert "tokenizers differ (the vocabulary)" in err and "tokenizer.json" in err


def swap_two_tokens(data: Path) -> None:
    """Give two ordinary tokens each other's ids: a tokenizer that encodes text differently."""
    tok = json.loads((data / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (data / "tokenizer.json").write_text(json.dumps(tok))


def test_bad_arguments(trained: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    assert "--eval-rows: must be >= 1" in _error(capsys, ["analyze", str(trained["san"]), "--eval-rows", "0"])
    assert "data dir not found" in _error(capsys, ["analyze", str(trained["san"]), "--data", "/nonexistent"])


def test_signal_command(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    rc = main(["signal", *TINY, "--depths", "2,8", "--rows", "2", "--seq-len", "16", "--json", str(tmp_path / "s.json")])
    assert rc == 0
    assert "E‖x_L‖²/E‖x₀‖²" in capsys.readouterr().out
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["depth"] for r in rows] == [2, 8]
    # Theorem 1: bounded at init with gates at ½ and W_o std s/√(2L)
    assert all(0.5 < r["ratio"] < 2.0 for r in rows)
    assert "expected comma-separated integers" in _error(capsys, ["signal", "--depths", "a,b"])
    assert "unknown key" in _error(capsys, ["signal", "model.nope=1"])


def test_same_run_twice_and_foreign_data(trained: dict[str, Path], capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert "given twice" in _error(capsys, ["analyze", str(trained["san"]), "--vs", str(trained["san"])])
    data2 = tmp_path / "data2"
    shutil.copytree(trained["data"], data2)
    swap_two_tokens(data2)
    err = _error(capsys, ["analyze", str(trained["san"]), "--data", str(data2), "--skip", "spectra"])
    assert f"tokenizers differ (the vocabulary): data {data2}" in err and f"pass --data {trained['data']}" in err


def test_diverged_run_is_recorded_not_a_crash(trained: dict[str, Path], tmp_path: Path) -> None:
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=512)

    def diverge(m) -> None:
        m.blocks[0].attn.wo.weight.fill_(float("nan"))

    run = write_run(tmp_path / "nan", cfg, {"latest": diverge, "milestone-000": lambda m: None,
                                            "milestone-100": diverge}, data_dir=trained["data"])  # fmt: skip
    assert main(["analyze", str(run), "--out", str(tmp_path / "out"), "--eval-rows", "4"]) == 0
    result = json.loads((tmp_path / "out" / "analysis.json").read_text())["runs"]["nan"]
    assert result["losses"]["loss"] is None  # NaN is written as null
    o_last = [r for r in result["spectra"]["per_matrix"] if r["type"] == "O" and r["milestone"] == 1.0]
    assert o_last[0]["stable_rank"] is None
    assert next(c for c in result["spectra"]["crystallisation"] if c["type"] == "O")["milestone"] is None


def _result(delta: float) -> dict:
    return {"runs": {"a": {"losses": {"region": [{"group": "body", "tokens": 10, "loss": 2.0 + delta}]}}},
            "comparisons": []}


def test_outputs_are_written_whole_analysis_json_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write cut before analysis.json's rename (a kill) leaves the last complete
    analysis.json, with its tables already new, never a torn file; a complete write
    replaces both."""
    from sanlab.analysis import output

    output.write_outputs(_result(0.0), tmp_path)
    assert json.loads((tmp_path / "analysis.json").read_text()) == _result(0.0)
    real = os.replace

    def cut(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "analysis.json":
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(output.os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        output.write_outputs(_result(1.0), tmp_path)
    assert json.loads((tmp_path / "analysis.json").read_text()) == _result(0.0)
    assert "3.0" in (tmp_path / "losses.csv").read_text()  # (the tables went first)
    monkeypatch.setattr(output.os, "replace", real)
    assert output.write_outputs(_result(1.0), tmp_path) == [tmp_path / "analysis.json", tmp_path / "losses.csv"]
    assert json.loads((tmp_path / "analysis.json").read_text()) == _result(1.0)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["analysis.json", "losses.csv"]
