"""The reference ternary linear: unpack, scale, matmul, in plain PyTorch.

This is the oracle every fast path is tested against, and the fallback for
problems no faster kernel takes. It follows :mod:`trit.format` literally: codes ``c`` in {0, 1, 2}, weight
``(c - 1) * scale[n, k // group]``, padded columns past ``in_features`` dropped.
The arithmetic is float32 throughout, rounded once at the end, so that it is
the most exact of the paths. With int8 activations (BitNet's W1.58A8) each
token is first quantized to int8 by its absolute maximum, the integer sums are
taken in float32 (exact for any realistic K) and divided by the token's scale
afterwards, as BitNet's ``BitLinear`` does. Unpacking goes through a 256-entry table (the
four values each byte holds, made by :func:`trit.format.unpack_codes`), one
gather per byte.
"""

from __future__ import annotations

import functools

import torch

from trit.format import CODES_PER_BYTE, unpack_codes


def _make_byte_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(256, 4) dtype: the four ternary values (c - 1) each byte value holds, in k order."""
    codes = unpack_codes(torch.arange(256, dtype=torch.uint8, device=device)[:, None])  # (256, 4) in {0..3}
    return (codes.to(torch.int16) - 1).to(dtype)


_cached_byte_table = functools.cache(_make_byte_table)


def _byte_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # while torch.compile traces, the table is made in the graph: a cached traced tensor would leak out of it
    if torch.compiler.is_compiling():
        return _make_byte_table(device, dtype)
    return _cached_byte_table(device, dtype)


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


INT8_MAX = 127


def quantize_activations_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8: ``x ~ x_q / s`` with ``s = 127 / max|x|`` over the last dimension.

    Returns ``x_q`` (..., K) int8 in [-128, 127] and ``s`` (..., 1) float32; a zero row gets
    ``max|x|`` floored at 1e-5, as in BitNet b1.58 (Ma et al. 2024, eq. 4-5).
    """
    xf = x.float()
    s = INT8_MAX / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return (xf * s).round().clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8), s


def fake_quantize_activations_int8(x: torch.Tensor) -> torch.Tensor:
    """``x_q / s`` in ``x.dtype``: what a kernel without an int8 path multiplies by instead of ``x``."""
    x_q, s = quantize_activations_int8(x)
    return (x_q.float() / s).to(x.dtype)


def linear_a8(
    x: torch.Tensor,  # (..., K) bf16/fp16/fp32
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
) -> torch.Tensor:  # (..., N) x.dtype
    """W1.58A8: ``(x_q @ dequantize(W).T) / s + bias`` in float32, rounded once to ``x.dtype``."""
    x_q, s = quantize_activations_int8(x)
    w = dequantize(packed, scale, group_size, x.shape[-1], torch.float32)
    y = torch.nn.functional.linear(x_q.float(), w) / s
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
