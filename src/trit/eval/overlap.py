"""The check that calibration or training text never overlaps evaluation text: shared token n-grams.

Perplexity on text a quantizer was calibrated on (or a student trained on)
flatters it. :func:`shared_ngrams` counts the token n-grams (default 32
tokens, long enough that a shared one means shared text) that occur in both;
the results scripts refuse to report a figure unless it is zero.
"""

from __future__ import annotations

import torch

NGRAM = 32


def _ngrams(ids: torch.Tensor, n: int) -> set[tuple[int, ...]]:
    rows = ids.reshape(-1, ids.shape[-1]) if ids.dim() > 1 else ids[None]
    out: set[tuple[int, ...]] = set()
    for row in rows.tolist():
        out.update(tuple(row[i:i + n]) for i in range(len(row) - n + 1))
    return out


def shared_ngrams(a: torch.Tensor, b: torch.Tensor, n: int = NGRAM) -> int:
    """How many distinct ``n``-token sequences occur in both ``a`` and ``b`` (each 1-D or a batch of rows)."""
    return len(_ngrams(a, n) & _ngrams(b, n))


class OverlapError(ValueError):
    """Calibration or training text shares text with the evaluation windows."""


def check_disjoint(train: torch.Tensor, evaluation: torch.Tensor, what: str, n: int = NGRAM) -> None:
    shared = shared_ngrams(train, evaluation, n)
    if shared:
        raise OverlapError(f"{what}: {shared} {n}-token sequences also occur in the evaluation windows")
