from __future__ import annotations

import pytest
import torch

from trit.eval.overlap import OverlapError, check_disjoint, check_disjoint_each, shared_ngrams


def test_shared_ngrams_finds_a_copied_window() -> None:
    text = torch.arange(1000)
    assert shared_ngrams(text[:400], text[600:]) == 0
    assert shared_ngrams(text[:400], text[368:700]) == 1  # exactly one 32-token window in common
    with pytest.raises(OverlapError, match="also occur in the evaluation windows"):
        check_disjoint(torch.stack([text[500:600], text[100:200]]), text[:300], "calibration")


def test_one_training_text_against_several_corpora() -> None:
    text = torch.arange(1000)
    train = torch.stack([text[500:600], text[100:200]])
    check_disjoint_each(train, {"a": text[300:480], "b": text[620:900]}, "heal")  # disjoint from both
    with pytest.raises(OverlapError, match="heal against b: 69 32-token sequences also occur in its evaluation"):
        check_disjoint_each(train, {"a": text[300:480], "b": text[:300]}, "heal")
