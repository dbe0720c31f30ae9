from __future__ import annotations

import pytest
import torch

from trit.eval.overlap import OverlapError, check_disjoint, shared_ngrams


def test_shared_ngrams_finds_a_copied_window() -> None:
    text = torch.arange(1000)
    assert shared_ngrams(text[:400], text[600:]) == 0
    assert shared_ngrams(text[:400], text[368:700]) == 1  # exactly one 32-token window in common
    with pytest.raises(OverlapError, match="also occur in the evaluation windows"):
        check_disjoint(torch.stack([text[500:600], text[100:200]]), text[:300], "calibration")
