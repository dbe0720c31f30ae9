"""Triton helpers that turn packed 2-bit codes into numbers, shared by the GEMV and GEMM kernels.

The kernels read the packed codes as int32 words (see :mod:`trit.format`):
word ``w`` of a row holds the codes of inputs ``16*w .. 16*w + 15``, input
``16*w + i`` in bits ``2*i``. Two decodings, both exact:

- :func:`decode_f32`: a code ``c`` placed in the low mantissa bits of the float
  ``2**23`` (bit pattern ``0x4B000000 | c``) reads as ``2**23 + c``; subtracting
  ``2**23 + 1`` leaves ``c - 1`` in {-1, 0, 1}. One shift, one logic op and one
  add per weight, no int-to-float conversion (a slow unit on NVIDIA GPUs).
- :func:`decode_i8`: shift, mask and subtract one, as int8, for int8 tensor
  cores (BitNet's W1.58A8).
- :func:`decode_pairs`: the same trick in 16-bit halves. ``(word >> 2*i) &
  0x00030003`` holds code ``i`` in bits 0-1 and code ``i + 8`` in bits 16-17;
  OR-ing the bf16 pattern of 128.0 (``0x4300``, or fp16 1024.0, ``0x6400``)
  into both halves gives two 16-bit floats ``128 + c`` from one 32-bit logic
  op, and subtracting 129 leaves ``c - 1``. The halves are then laid out back
  in natural K order (a relabelling of registers, no data movement).

Under ``TRITON_INTERPRET=1`` (the CPU tests) bf16 subtraction is done in fp32,
because the interpreter's bf16 arithmetic is inexact; the values are the same.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

WORD = 16  # codes per int32 word
F32_MAGIC = 0x4B000000  # 2**23
F32_BIAS = 8388609.0  # 2**23 + 1


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def decode_f32(words):
    """``[R, W]`` int32 words -> ``[R, W, 16]`` float32 values in {-1, 0, 1}, natural K order."""
    shifts = 2 * tl.arange(0, 16)
    codes = (words[:, :, None] >> shifts[None, None, :]) & 3
    return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388609.0


@triton.jit
def decode_i8(words):
    """``[R, W]`` int32 words -> ``[R, W, 16]`` int8 values in {-1, 0, 1}, natural K order."""
    codes = (words[:, :, None] >> (2 * tl.arange(0, 16))[None, None, :]) & 3
    return (codes - 1).to(tl.int8)


@triton.jit
def split_halves(words, DTYPE: tl.constexpr):
    """``[...]`` int32 -> ``[..., 2]`` DTYPE (bf16 or fp16): each word's low and high 16 bits, as they are."""
    lo = (words & 0xFFFF).to(tl.uint16)
    hi = ((words >> 16) & 0xFFFF).to(tl.uint16)
    return tl.join(lo, hi).to(DTYPE, bitcast=True)


@triton.jit
def decode_pairs(words, DTYPE: tl.constexpr, INTERPRET: tl.constexpr = False):
    """``[R, W]`` int32 words -> ``[R, W * 16]`` values in {-1, 0, 1} of ``DTYPE`` (bf16 or fp16), natural K order."""
    if DTYPE.is_bf16():
        magic: tl.constexpr = 0x43004300  # 128.0 in both bf16 halves: one unit per mantissa step
        bias: tl.constexpr = 129.0
    else:
        magic: tl.constexpr = 0x64006400  # 1024.0 in both fp16 halves
        bias: tl.constexpr = 1025.0
    shifts = 2 * tl.arange(0, 8)
    halves = ((words[:, :, None] >> shifts[None, None, :]) & 0x00030003) | magic  # [R, W, 8] int32
    vals = split_halves(halves, DTYPE)  # [R, W, 8, 2]: 128 + c (bf16) or 1024 + c (fp16), codes i and i + 8
    vals = tl.permute(vals, (0, 1, 3, 2))  # [R, W, 2, 8]: position 8*j + i holds code i + 8*j
    if INTERPRET:  # the CPU interpreter's bf16 arithmetic is not exact: subtract in fp32 there
        vals = (vals.to(tl.float32) - bias).to(DTYPE)
    else:
        vals = vals - bias
    return tl.reshape(vals, (words.shape[0], words.shape[1] * 16)).to(DTYPE)
