"""The reference ternary linear: unpack, scale, matmul, in plain PyTorch.

This is the oracle every fast path is tested against, and the fallback for
problems no faster kernel takes. It follows :mod:`trit.format` literally: codes ``c`` in {0, 1, 2}, weight
``(c - 1) * scale[n, k // group]``, padded columns past ``in_features`` dropped.
The arithmetic is float32 throughout, rounded once at the end, so that it is
the most exact of the paths. Unpacking goes through a 256-entry table (the
four values each byte holds, made by :func:`trit.format.unpack_codes`), one
gather per byte.
"""

from __future__ import annotations

import functools

import torch

from trit.format import CODES_PER_BYTE, unpack_codes


@functools.cache
def _byte_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(256, 4) dtype: the four ternary values (c - 1) each byte value holds, in k order."""
    codes = unpack_codes(torch.arange(256, dtype=torch.uint8)[:, None])  # (256, 4) in {0, 1, 2, 3}
    return (codes.to(torch.int16) - 1).to(device=device, dtype=dtype)


def dequantize(
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G) fp16/bf16
    group_size: int,
    in_features: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (N, in_features) dtype
    n, k_pad = packed.shape[0], packed.shape[1] * CODES_PER_BYTE
    values = _byte_table(packed.device, dtype)[packed.long()]  # (N, K_pad // 4, 4)
    g = k_pad if group_size == -1 else group_size
    w = values.view(n, k_pad // g, g) * scale.to(dtype)[:, :, None]
    return w.view(n, k_pad)[:, :in_features]


def linear(
    x: torch.Tensor,  # (..., K) bf16/fp16/fp32
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
) -> torch.Tensor:  # (..., N) x.dtype
    """Computed in float32 (exact ternary values, fp32 scales and sums), rounded once to ``x.dtype``."""
    w = dequantize(packed, scale, group_size, x.shape[-1], torch.float32)
    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x.float(), w, b).to(x.dtype)
