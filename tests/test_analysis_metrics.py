"""Each analysis metric on a constructed input whose answer is known in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from sanlab.analysis import metrics as M


def _rank_k(m: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """An m×n matrix with exactly k equal non-zero singular values (all 3.0)."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    return 3.0 * u @ v.T


@pytest.mark.parametrize("k", [1, 3, 7])
def test_rank_k_matrix_effective_and_stable_rank_equal_k(k: int) -> None:
    s = M.singular_values(_rank_k(16, 12, k))
    assert M.entropy_effective_rank(s) == pytest.approx(k, rel=1e-9)
    assert M.stable_rank(s) == pytest.approx(k, rel=1e-9)
    assert M.spectral_norm(s) == pytest.approx(3.0, rel=1e-9)


def test_stable_rank_of_known_spectrum() -> None:
    s = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)
    assert M.stable_rank(s) == pytest.approx(6.0 / 4.0)
    p = torch.tensor([0.5, 0.25, 0.25])
    assert M.entropy_effective_rank(s) == pytest.approx(math.exp(-(p * p.log()).sum().item()))


def test_zero_matrix_has_rank_zero() -> None:
    s = M.singular_values(torch.zeros(4, 4))
    assert M.stable_rank(s) == 0.0 and M.entropy_effective_rank(s) == 0.0


def test_spectrum_distance_ignores_scale_and_detects_shape() -> None:
    s = torch.tensor([3.0, 2.0, 1.0])
    assert M.spectrum_distance(s, 10 * s) == pytest.approx(0.0, abs=1e-12)
    # [1,0,0] vs uniform: ½(|1−⅓| + ⅓ + ⅓) = ⅔
    assert M.spectrum_distance(torch.tensor([1.0, 0, 0]), torch.ones(3)) == pytest.approx(2 / 3)


def test_crystallisation_index() -> None:
    assert M.crystallisation_index([0.5, 0.01, 0.01, 0.01], tol=0.05) == 1
    assert M.crystallisation_index([0.01, 0.01], tol=0.05) == 0
    assert M.crystallisation_index([0.01, 0.5], tol=0.05) is None  # still moving at the end
    assert M.crystallisation_index([], tol=0.05) is None


def test_representation_rank_of_rank_k_cloud_and_streaming_matches() -> None:
    g = torch.Generator().manual_seed(1)
    basis, _ = torch.linalg.qr(torch.randn(32, 4, generator=g, dtype=torch.float64))
    # ±1 codes on 4 orthonormal directions, balanced: centred singular values all equal
    codes = torch.tensor([[(i >> b) & 1 for b in range(4)] for i in range(16)], dtype=torch.float64)
    h = (2 * codes - 1) @ basis.T + 5.0  # a constant offset the centring must remove
    assert M.representation_rank(h) == pytest.approx(4.0, rel=1e-6)
    acc = M.CovarianceAccumulator(32)
    acc.add(h[:5])
    acc.add(h[5:])
    assert M.entropy_effective_rank(acc.centred_singular_values()) == pytest.approx(4.0, rel=1e-6)


def _uniform_causal(b: int, h: int, t: int) -> torch.Tensor:
    mask = torch.ones(t, t).tril()
    return (mask / mask.sum(-1, keepdim=True)).expand(b, h, t, t).clone()  # (B, H, T, T)


def test_uniform_pattern_entropy_is_log_of_causal_support() -> None:
    t = 8
    a = _uniform_causal(2, 3, t)
    out = M.attention_metrics(a)
    expected = sum(math.log(i + 1) for i in range(t)) / t
    assert torch.allclose(out["entropy"], torch.full((3,), expected, dtype=torch.float64))
    # every head identical → no diversity
    assert float(out["head_diversity"]) == pytest.approx(0.0, abs=1e-7)
    # ‖A‖²_F = Σ_i 1/(i+1)
    frob = math.sqrt(sum(1 / (i + 1) for i in range(t)))
    assert torch.allclose(out["concentration"], torch.full((3,), frob, dtype=torch.float64))
    # sink: query i > 0 puts 1/(i+1) on token 0
    sink = sum(1 / (i + 1) for i in range(1, t)) / (t - 1)
    assert torch.allclose(out["sink"], torch.full((3,), sink, dtype=torch.float64))


def test_uniform_pattern_respects_document_boundaries() -> None:
    # two documents of 3 and 5 tokens packed into one row
    seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    same = (seg[:, :, None] == seg[:, None, :]) & torch.ones(8, 8, dtype=torch.bool).tril()
    a = (same.float() / same.float().sum(-1, keepdim=True))[:, None]  # (1, 1, 8, 8)
    out = M.attention_metrics(a, seg)
    expected = (sum(math.log(i + 1) for i in range(3)) + sum(math.log(i + 1) for i in range(5))) / 8
    assert float(out["entropy"][0]) == pytest.approx(expected)
    sink = (1 / 2 + 1 / 3 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 6  # first token of each document
    assert float(out["sink"][0]) == pytest.approx(sink)
    pos, start = M.segment_positions(seg)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert start.tolist() == [[0, 0, 0, 3, 3, 3, 3, 3]]


def test_identity_pattern_local_focus() -> None:
    t = 6
    a = torch.eye(t).expand(1, 2, t, t).clone()
    out = M.attention_metrics(a)
    assert torch.allclose(out["local_0"], torch.ones(2, dtype=torch.float64))
    for d in (1, 2, 3):
        assert torch.allclose(out[f"local_{d}"], torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(out["entropy"], torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(out["concentration"], torch.full((2,), math.sqrt(t), dtype=torch.float64))
    assert torch.allclose(out["sink"], torch.zeros(2, dtype=torch.float64))


def test_previous_token_pattern_local_focus_at_distance_one() -> None:
    t = 5
    a = torch.zeros(1, 1, t, t)
    a[0, 0, 0, 0] = 1.0
    for i in range(1, t):
        a[0, 0, i, i - 1] = 1.0
    out = M.attention_metrics(a)
    assert float(out["local_1"][0]) == pytest.approx(1.0)
    assert float(out["local_0"][0]) == pytest.approx(1 / t)  # only the forced first query


def test_sink_pattern_and_head_diversity() -> None:
    t = 6
    sink = torch.zeros(t, t)
    sink[:, 0] = 1.0
    ident = torch.eye(t)
    a = torch.stack([sink, ident])[None]  # (1, 2, T, T): head 0 sink, head 1 identity
    out = M.attention_metrics(a)
    assert out["sink"].tolist() == pytest.approx([1.0, 0.0])
    # causal triangle has T(T+1)/2 cells; the heads differ (std ½) on the 2(T−1) cells
    # where exactly one of them puts its mass: column 0 below the diagonal and the diagonal below row 0
    expected = 0.5 * 2 * (t - 1) / (t * (t + 1) / 2)
    assert float(out["head_diversity"]) == pytest.approx(expected)


def test_query_mask_excludes_positions() -> None:
    t = 4
    a = torch.eye(t).expand(1, 1, t, t).clone()
    a[0, 0, 3] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    mask = torch.tensor([[True, True, True, False]])
    assert float(M.attention_metrics(a, None, mask)["entropy"][0]) == pytest.approx(0.0)


def test_sums_merge_equals_single_batch() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 2, 7, 7, generator=g).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -1e9)
    a = logits.softmax(-1)
    whole = M.attention_sums(a).means()
    acc = M.attention_sums(a[:1])
    acc.merge(M.attention_sums(a[1:]))
    for k, v in whole.items():
        assert torch.allclose(acc.means()[k], v), k


def test_minmax() -> None:
    x = torch.tensor([2.0, 4.0, float("nan"), 3.0])
    out = M.minmax(x)
    assert out[0] == 0.0 and out[1] == 1.0 and out[3] == 0.5 and out[2].isnan()
    assert M.minmax(torch.tensor([1.0, 1.0])).tolist() == [0.0, 0.0]


def test_rms_and_max_abs() -> None:
    x = torch.tensor([[[3.0, -4.0], [100.0, 0.0]]])  # (1, 2, 2)
    mask = torch.tensor([[True, False]])
    assert M.rms(x, mask) == pytest.approx(math.sqrt(12.5))
    assert M.max_abs(x, mask) == 4.0
    assert M.max_abs(x) == 100.0
