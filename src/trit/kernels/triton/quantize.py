"""BitNet's per-token int8 activation rounding (W1.58A8) in one launch: a program a row.

``s = 127 / max|x|`` over the row (the maximum floored at 1e-5), ``x_q =
clamp(round_half_even(x * s), -128, 127)``, as
:func:`trit.kernels.reference.quantize_activations_int8`. :func:`quantize_rows`
writes ``x_q`` (int8) and ``s``; :func:`fake_quantize_rows` writes ``x_q / s``
in the activations' dtype, what a kernel without an int8 path multiplies by.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round_code(v):
    # round half to even, as torch.round: adding 1.5 * 2**23 leaves no fraction bits (|v| <= 127)
    r = (v + 12582912.0) - 12582912.0
    return tl.minimum(tl.maximum(r, -128.0), 127.0)


@triton.jit
def _row_codes(x_ptr, row, K, stride_xm, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
    s = 127.0 / tl.maximum(tl.max(tl.abs(x), axis=0), 1e-5)
    return offs, _round_code(x * s), s


@triton.jit
def _quantize_rows(
    x_ptr,  # (M, K) bf16/fp16/fp32, row stride stride_xm
    q_ptr,  # (M, K) int8
    s_ptr,  # (M,) f32: 127 / max|x|
    K, stride_xm,
    BLOCK: tl.constexpr,  # >= K, a power of two
):
    row = tl.program_id(0)
    offs, q, s = _row_codes(x_ptr, row, K, stride_xm, BLOCK)
    tl.store(q_ptr + row * K + offs, q.to(tl.int8), mask=offs < K)
    tl.store(s_ptr + row, s)


@triton.jit
def _fake_quantize_rows(
    x_ptr,  # (M, K) bf16/fp16/fp32, row stride stride_xm
    y_ptr,  # (M, K) x's dtype: x_q / s
    K, stride_xm,
    BLOCK: tl.constexpr,  # >= K, a power of two
    BF16: tl.constexpr,  # y is bf16: rounded to nearest even here, so that the cast is exact wherever it runs
):
    row = tl.program_id(0)
    offs, q, s = _row_codes(x_ptr, row, K, stride_xm, BLOCK)
    y = q / s
    if BF16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True)
    tl.store(y_ptr + row * K + offs, y.to(y_ptr.dtype.element_ty), mask=offs < K)


@triton.jit
def _quantize_rows_mma(
    x_ptr,  # (M, K) bf16/fp16/fp32, row stride stride_xm
    q_ptr,  # (M, KP) int8: each 32 inputs in the k32 A fragment's order (wgmma_a8.input_order), zero past K
    s_ptr,  # (M,) f32: 127 / max|x|
    sum_ptr,  # (M,) int32: the row's sum of codes
    K, KP, stride_xm,
    BLOCK: tl.constexpr,  # >= KP, a power of two
):
    row = tl.program_id(0)
    offs, _, s = _row_codes(x_ptr, row, K, stride_xm, BLOCK)
    pos = offs % 32
    src = offs - pos + 16 * (pos % 2) + 8 * (pos // 16) + 2 * ((pos % 16) // 4) + (pos % 4) // 2
    x = tl.load(x_ptr + row * stride_xm + src, mask=src < K, other=0.0).to(tl.float32)
    q = tl.where(offs < KP, _round_code(x * s), 0.0)
    tl.store(q_ptr + row * KP + offs, q.to(tl.int8), mask=offs < KP)
    tl.store(s_ptr + row, s)
    tl.store(sum_ptr + row, tl.sum(q.to(tl.int32), axis=0))


def _launch(kernel, x: torch.Tensor, *outs: torch.Tensor, **flags) -> None:
    m, k = x.shape
    block = triton.next_power_of_2(k)
    kernel[(m,)](x, *outs, k, x.stride(0), BLOCK=block, num_warps=min(16, max(1, block // 512)), **flags)


def _rows(x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (M, K), unit stride along K
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) float -> int8 codes (M, K) and f32 scales (M,): one pass per row."""
    m, k = x.shape
    q = torch.empty((m, k), device=x.device, dtype=torch.int8)
    s = torch.empty((m,), device=x.device, dtype=torch.float32)
    _launch(_quantize_rows, _rows(x), q, s)
    return q, s


def fake_quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """(..., K) float -> ``x_q / s`` (..., K) in ``x.dtype``, one launch."""
    x2 = _rows(x)
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    if x2.shape[0]:
        _launch(_fake_quantize_rows, x2, y, BF16=x.dtype == torch.bfloat16)
    return y.view(x.shape)


def quantize_rows_mma(x: torch.Tensor, k_pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, K) float -> what the int8 wgmma kernel reads (:func:`trit.kernels.cuda.wgmma_a8.quantize_reference`):
    codes (M, ``k_pad``) int8 in the A fragment's order, scales (M,) f32, sums of codes (M,) int32, one launch."""
    x2 = _rows(x)
    m, k = x2.shape
    q = torch.empty((m, k_pad), device=x.device, dtype=torch.int8)
    s = torch.empty((m,), device=x.device, dtype=torch.float32)
    sums = torch.empty((m,), device=x.device, dtype=torch.int32)
    if m:
        block = triton.next_power_of_2(k_pad)
        _quantize_rows_mma[(m,)](x2, q, s, sums, k, k_pad, x2.stride(0), BLOCK=block,
                                 num_warps=min(16, max(1, block // 512)))
    return q, s, sums
