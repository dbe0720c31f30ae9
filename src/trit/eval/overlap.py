"""The check that calibration or training text never overlaps evaluation text: shared token n-grams.

Perplexity on text a quantizer was calibrated on (or a student trained on)
flatters it. :func:`shared_ngrams` counts the token n-grams (default 32
tokens, long enough that a shared one means shared text) that occur in both;
the results scripts refuse to report a figure unless it is zero.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def check_disjoint_each(train: torch.Tensor, evaluations: Mapping[str, torch.Tensor], what: str,
                        n: int = NGRAM) -> None:
    """:func:`check_disjoint` against several named evaluation texts, the training text's n-grams built once
    (a large training set, such as heal's, checked against every corpus)."""
    grams = _ngrams(train, n)
    for name, evaluation in evaluations.items():
        shared = len(grams & _ngrams(evaluation, n))
        if shared:
            raise OverlapError(f"{what} against {name}: {shared} {n}-token sequences also occur in its evaluation "
                               "windows")
