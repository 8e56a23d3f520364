"""The loss mask, checked token by token against the document format it comes from.

Every document is [BOS] text [EOS], so across a whole split the steps that leave a
document are exactly those whose input is EOS, equivalently whose target is the next
document's BOS. The mask must drop those and the padding, and keep everything else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sanlab.data.loader import Loader

PAD, EOS, BOS = 0, 1, 2  # SPEC §1.5


def test_the_loss_mask_drops_exactly_the_document_boundaries_and_padding(train_data_dir: Path) -> None:
    loader = Loader(train_data_dir, batch_rows=1, verify=False)
    b = loader.rows_batch(np.arange(loader.n_rows))
    inputs, targets, mask = b["inputs"], b["targets"], b["loss_mask"]
    expected = (targets != PAD) & (targets != BOS) & (inputs != EOS)
    boundaries = int(((inputs == EOS) & (targets == BOS)).sum())
    assert boundaries > 10  # rows do hold document boundaries
    assert int(((inputs == EOS) & (targets == PAD)).sum()) <= 1  # the last document, then padding
    assert (mask == expected).all(), f"{int((mask != expected).sum())} tokens masked wrongly"
