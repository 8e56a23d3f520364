"""The residual-stream statistics (`sanlab.analysis.stream.StreamCollector`) against their
definitions over the masked tokens: RMS = √(Σ x² / (tokens · d)), the largest |x|, and the
entropy effective rank of the centred states, accumulated over batches."""

from __future__ import annotations

import math

import pytest
import torch

from sanlab.analysis import metrics as M
from sanlab.analysis.stream import StreamCollector


def test_stream_rms_peak_and_rank_over_the_masked_tokens_of_two_batches() -> None:
    d = 4
    a = torch.tensor([[[1.0, -1.0, 1.0, -1.0], [9.0, 9.0, 9.0, 9.0], [2.0, 0.0, 0.0, 0.0]]])  # (1, 3, 4)
    mask_a = torch.tensor([[True, False, True]])  # the 9s are padding
    b = torch.tensor([[[0.0, 3.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, -4.0]]])  # (2, 1, 4)
    mask_b = torch.tensor([[True], [True]])
    s = StreamCollector(["h"], d)
    s.add("h", a, mask_a)
    s.add("h", b, mask_b)
    (row,) = s.results()
    kept = torch.tensor([[1.0, -1.0, 1.0, -1.0], [2.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, -4.0]])
    # Σ x² = 4 + 4 + 9 + 16 = 33 over 4 tokens × 4 dims
    assert row["rms"] == pytest.approx(math.sqrt(33 / 16))
    assert row["max_abs"] == 4.0  # the masked 9s do not count
    centred = (kept - kept.mean(0)).double()
    want = M.entropy_effective_rank(torch.linalg.svdvals(centred))
    assert row["rep_rank"] == pytest.approx(want, rel=1e-9)
    assert StreamCollector(["h"], d).results()[0]["rms"] != StreamCollector(["h"], d).results()[0]["rms"]  # NaN
