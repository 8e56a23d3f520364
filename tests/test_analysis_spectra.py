"""Weight spectra over milestones: per-matrix and per-type tables, crystallisation points."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from analysis_rundirs import write_run
from sanlab.analysis import spectra as S
from sanlab.analysis.rundir import RunDir
from sanlab.config import ModelConfig
from sanlab.errors import CheckpointError

TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn=True)


def test_matrix_type_names() -> None:
    assert S.matrix_type("blocks.3.attn.wq.weight") == (3, "Q")
    assert S.matrix_type("blocks.0.ffn.w_down.weight") == (0, "down")
    assert S.matrix_type("blocks.1.attn.w_mix.weight") == (1, "attn.w_mix")
    assert S.matrix_type("embed.weight") is None
    assert S.matrix_type("blocks.0.attn_gate") is None


def test_state_spectra_covers_every_hidden_matrix() -> None:
    torch.manual_seed(0)
    from sanlab.model.lm import LM

    sp = S.state_spectra(LM(TINY).state_dict())
    assert sorted(sp) == sorted((l, t) for l in range(2) for t in S.TYPE_ORDER)
    wk = LM(TINY).state_dict()["blocks.0.attn.wk.weight"]
    assert sp[(0, "K")].shape == (min(wk.shape),)


def _low_rank(k: int, n: int = 8) -> torch.Tensor:
    s = torch.zeros(n, dtype=torch.float64)
    s[:k] = 1.0
    return s


def test_spectra_over_milestones_tables_and_crystallisation() -> None:
    # Q settles after the first milestone; O keeps gaining rank until the end
    ms = [
        (0.0, {(0, "Q"): _low_rank(8), (0, "O"): _low_rank(1)}),
        (0.25, {(0, "Q"): _low_rank(2), (0, "O"): _low_rank(2)}),
        (0.5, {(0, "Q"): 3 * _low_rank(2), (0, "O"): _low_rank(4)}),
        (1.0, {(0, "Q"): _low_rank(2), (0, "O"): _low_rank(8)}),
    ]
    res = S.spectra_over_milestones(ms, tol=0.05)
    crystal = {r["type"]: r["milestone"] for r in res.crystallisation}
    assert crystal == {"Q": 0.25, "O": None}
    o_rank = [r["effective_rank"] for r in res.per_type if r["type"] == "O"]
    assert o_rank == pytest.approx([1, 2, 4, 8])
    assert len(res.per_matrix) == 8
    q_norm = [r["spectral_norm"] for r in res.per_matrix if r["type"] == "Q"]
    assert q_norm == pytest.approx([1, 1, 3, 1])


def _set_rank(name: str, k: int):
    """A checkpoint edit that makes every `name` matrix rank k with equal singular values."""

    def edit(lm) -> None:
        for pname, p in lm.named_parameters():
            if pname.endswith(name):
                p.zero_()
                p[:k, :k] = torch.eye(k)

    return edit


def test_run_spectra_reads_milestones(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run",
        TINY,
        {
            "milestone-000": lambda m: None,
            "milestone-050": _set_rank("attn.wo.weight", 3),
            "milestone-100": _set_rank("attn.wo.weight", 5),
            "latest": lambda m: None,
        },
    )
    res = S.run_spectra(RunDir.open(run))
    assert sorted({r["milestone"] for r in res.per_type}) == [0.0, 0.5, 1.0]
    o = [r for r in res.per_type if r["type"] == "O"]
    assert [round(r["stable_rank"], 6) for r in o][1:] == [3.0, 5.0]
    types = [r["type"] for r in res.crystallisation]
    assert types == list(S.TYPE_ORDER)
    # nothing but O changes between milestone 50 and 100 here
    q = next(r for r in res.crystallisation if r["type"] == "Q")
    assert q["milestone"] == 0.0 and q["distances"] == [0.0, 0.0]


def test_run_without_milestones_is_a_clear_error(tmp_path: Path) -> None:
    run = RunDir.open(write_run(tmp_path / "run", TINY))
    with pytest.raises(CheckpointError, match="no milestone checkpoints.*available: latest"):
        S.run_spectra(run)


def test_a_growing_top_singular_value_is_not_settled() -> None:
    """The normalised spectrum of [x, 1, …, 1] (200 values) barely moves as x grows 2 → 4 → 8
    (total variation < 0.02 per step) while the stable rank (x² + 199) / x² falls 50.75 →
    13.4 → 4.1: the type has not settled, whatever the shape alone says; a spectrum that
    keeps its shape and its stable rank (a uniform scale-up) settles at once."""

    def spike(x: float) -> torch.Tensor:
        s = torch.ones(200, dtype=torch.float64)
        s[0] = x
        return s

    flat = torch.linspace(2.0, 1.0, 200, dtype=torch.float64)
    ms = [(f, {(0, "down"): spike(x), (0, "Q"): c * flat}) for f, x, c in ((0.0, 2, 1), (0.5, 4, 2), (1.0, 8, 3))]
    res = S.spectra_over_milestones(ms, tol=0.02)
    down = next(c for c in res.crystallisation if c["type"] == "down")
    assert all(d < 0.02 for d in down["distances"])  # the shape rule alone would call it settled at 0
    ranks = [r["stable_rank"] for r in res.per_type if r["type"] == "down"]
    assert ranks == pytest.approx([(x * x + 199) / (x * x) for x in (2, 4, 8)])
    assert down["rank_changes"] == pytest.approx([abs(b - a) / a for a, b in zip(ranks, ranks[1:])])
    assert down["milestone"] is None
    q = next(c for c in res.crystallisation if c["type"] == "Q")
    assert q["milestone"] == 0.0 and q["rank_changes"] == pytest.approx([0.0, 0.0])
