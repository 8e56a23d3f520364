"""`sanlab match`: Table 1 on the terminal, JSON arms, and one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.errors import EXIT_USAGE


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["match", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["match", *argv]) == EXIT_USAGE
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sanlab: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def test_preset_base_prints_table1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["match", "--preset", "base", "--breakdown"]) == 0
    out = capsys.readouterr().out
    for text in ("20L d512", "24.13M", "15.74M", "0.396",  # SAN
                 "4L d512", "24.12M", "15.73M", "0.195",  # iso-param
                 "9L d512", "0.376",  # iso-FLOP
                 "87.06M", "78.67M",  # iso-depth
                 "q·kᵀ", "41.9"):  # the FLOP breakdown: 20 · 2 · 2048 · 512 attention-score FLOPs
        assert text in out, text


def test_json_arms(capsys: pytest.CaptureFixture[str]) -> None:
    arms = _json(capsys, "--preset", "base")
    assert [a["name"] for a in arms] == ["SAN", "FFN iso-param", "FFN iso-FLOP", "FFN iso-depth"]
    assert [a["n_layers"] for a in arms] == [20, 4, 9, 20]
    assert [round(a["params_total"] / 1e6, 2) for a in arms] == [24.13, 24.12, 43.79, 87.06]
    assert [round(a["params_non_embedding"] / 1e6, 2) for a in arms] == [15.74, 15.73, 35.40, 78.67]
    assert [round(a["train_flops_per_token"] / 1e9, 2) for a in arms[:2]] == [0.40, 0.20]
    for a in arms:
        assert a["d_model"] == 512 and a["ffn"] == (a["name"] != "SAN")
        f = a["flops"]
        assert f["forward"] == f["attn_proj"] + f["attn_scores"] + f["attn_mix"] + f["ffn"] + f["head"]
        assert a["train_flops_per_token"] == 3 * f["forward"]
    assert arms[0]["mismatch"] == 0 and arms[1]["mismatch"] == pytest.approx(-0.00052, abs=1e-5)


def test_preset_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    san = _json(capsys, "--preset", "tiny")[0]
    assert (round(san["params_total"] / 1e6, 2), round(san["params_non_embedding"] / 1e6, 2)) == (6.16, 1.97)


def test_any_reference_from_file_and_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[model]\nd_model = 128\nn_layers = 6\nvocab_size = 1000\n\n[data]\nseq_len = 512\n")
    arms = _json(capsys, str(cfg), "n_layers=8", "--policy", "nearest", "--causal-half")
    ref = arms[0]
    assert (ref["d_model"], ref["n_layers"], ref["flops"]["seq_len"]) == (128, 8, 512)
    assert ref["flops"]["causal_half"] and ref["flops"]["attn_scores"] == 8 * 512 * 128
    assert _json(capsys, str(cfg), "--seq-len", "64")[0]["flops"]["seq_len"] == 64
    # Plain keys are model keys; sectioned keys work too.
    plain = _json(capsys, "d_model=64", "model.n_layers=3", "--targets", "depth")
    assert [(a["d_model"], a["n_layers"], a["ffn"]) for a in plain] == [(64, 3, False), (64, 3, True)]


def test_width_and_partner_options(capsys: pytest.CaptureFixture[str]) -> None:
    arms = _json(capsys, "--preset", "base", "--width", "--partner", "residual=standard")
    assert all(a["n_layers"] == 20 for a in arms)
    assert [a["d_model"] for a in arms] == [512, 224, 320, 512]
    assert [a["config"]["residual"] for a in arms] == ["gated", "standard", "standard", "standard"]


def test_impossible_matching_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, "--preset", "base", "n_layers=1")
    assert "no FFN partner with at most the reference's non-embedding parameters" in line
    line = _error(capsys, "--preset", "base", "--tolerance", "0.01")
    assert "FFN iso-FLOP" in line and "tolerance" in line


@pytest.mark.parametrize("argv,needle", [
    (["--preset", "base", "foo=1"], "unknown key model.foo"),
    (["--preset", "base", "train.nope=1"], "unknown key train.nope"),
    (["--preset", "base", "--partner", "bogus=2"], "unknown key bogus"),
    (["--preset", "base", "--partner", "n_layers=3"], "n_layers is what the solver chooses"),
    (["--preset", "base", "n_heads=7"], "does not divide"),
    (["--preset", "base", "--targets", "speed"], "unknown target 'speed'"),
    (["--preset", "base", "--seq-len", "0"], "argument --seq-len: must be >= 1"),
    (["no-such-file.toml"], "config file not found"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert needle in _error(capsys, *argv)


def test_preset_and_file_conflict(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[model]\nd_model = 128\n")
    assert "not both" in _error(capsys, str(cfg), "--preset", "base")
