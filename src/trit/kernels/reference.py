"""The reference ternary linear: unpack, scale, matmul, in plain PyTorch.

This is the oracle every fast path is tested against, and the fallback for
problems no faster kernel takes. It follows :mod:`trit.format` literally: codes ``c`` in {0, 1, 2}, weight
``(c - 1) * scale[n, k // group]``, padded columns past ``in_features`` dropped.
The arithmetic is float32 throughout, rounded once at the end, so that it is
the most exact of the paths. With int8 activations (BitNet's W1.58A8) each
token is first quantized to int8 by its absolute maximum, the integer sums are
taken in float32 (exact for any realistic K) and divided by the token's scale
afterwards, as BitNet's ``BitLinear`` does. The weight comes from
:func:`trit.format.dequantize`.
"""

from __future__ import annotations

import torch

from trit.format import dequantize


def linear(
    x: torch.Tensor,  # (..., K) bf16/fp16/fp32
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
) -> torch.Tensor:  # (..., N) x.dtype
    """Computed in float32 (exact ternary values, fp32 scales and sums), rounded once to ``x.dtype``."""
    w = dequantize(packed, scale, x.shape[-1], torch.float32)
    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x.float(), w, b).to(x.dtype)


INT8_MAX = 127


def quantize_activations_int8(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8: ``x ~ x_q / s`` with ``s = 127 / max|x|`` over the last dimension.

    Returns ``x_q`` (..., K) int8 in [-128, 127] and ``s`` (..., 1) float32; a zero row gets
    ``max|x|`` floored at 1e-5, as in BitNet b1.58 (Ma et al. 2024, eq. 4-5). ``amax`` (..., 1), where given, is
    the row's ``max|x|`` (a row whose K is split over tensor-parallel ranks: the max over all of them).
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True) if amax is None else amax.float()
    s = INT8_MAX / amax.clamp(min=1e-5)
    return (xf * s).round().clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8), s


def fake_quantize_activations_int8(x: torch.Tensor, amax: torch.Tensor | None = None) -> torch.Tensor:
    """``x_q / s`` in ``x.dtype``: what a kernel without an int8 path multiplies by instead of ``x``."""
    x_q, s = quantize_activations_int8(x, amax)
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
    y = linear(x_q.float(), packed, scale, group_size) / s  # (..., N) f32: integer sums, then the token's scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
