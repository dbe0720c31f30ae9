"""Ternary quantizers: pure functions from a float weight to codes and scales.

Each method takes a ``(N, K)`` float weight with K a multiple of the group size
(the converter pads first) and returns a :class:`Ternary`: int8 values in
{-1, 0, 1} and float32 scales ``(N, K // group)`` (``(N, 1)`` for group -1).
They run on any device and never touch files.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from trit.quant.absmean import quantize_absmean
from trit.quant.common import Ternary, dequantize_ternary
from trit.quant.twn import quantize_twn

__all__ = ["DATA_FREE", "Method", "Ternary", "dequantize_ternary", "quantize", "quantize_absmean", "quantize_twn"]


class Method(str, enum.Enum):
    ABSMEAN = "absmean"
    TWN = "twn"
    GPTQ = "gptq"  # calibrated: needs inputs, see trit.quant.gptq and trit.calibrate


_METHODS: dict[Method, Callable[[torch.Tensor, int], Ternary]] = {
    Method.ABSMEAN: quantize_absmean,
    Method.TWN: quantize_twn,
}
DATA_FREE = tuple(_METHODS)  # the methods :func:`quantize` runs; GPTQ needs calibration inputs


def quantize(weight: torch.Tensor, group_size: int, method: Method | str = Method.ABSMEAN) -> Ternary:
    """Quantize ``weight`` (N, K) float with a data-free ``method``; K must be a multiple of ``group_size``."""
    if Method(method) not in _METHODS:
        raise ValueError(f"{Method(method).value} needs calibration inputs: use trit.calibrate")
    return _METHODS[Method(method)](weight, group_size)
