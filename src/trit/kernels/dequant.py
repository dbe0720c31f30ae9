"""Dequantize a ternary layer to a dense bf16/fp16 matrix on the GPU, for cuBLAS to multiply.

For long prefills (thousands of rows) the matmul is compute-bound and cuBLAS
runs the tensor cores near their peak; writing the dense weight once costs
``2 * N * K`` bytes, small beside ``2 * M * N * K`` flops when M is large. The
decode is :func:`trit.kernels.decode.decode_pairs`, then one multiply by the
group scale, rounded once to the activation dtype.

Configs first, then the kernel, then the launcher.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trit.kernels.decode import decode_pairs, interpreting

BLOCK_N = 32
BLOCK_KW = 8  # 128 weights per row per program


@triton.jit
def _dequant_kernel(
    w_ptr,  # (N, KW) int32 words
    s_ptr,  # (N, G) scales
    out_ptr,  # (N, K) dtype
    N, K, KW, G,
    GROUP_W: tl.constexpr,  # words per group (KW for one scale per row)
    BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * BLOCK_KW + tl.arange(0, BLOCK_KW)
    mask = (rows < N)[:, None] & (offs_w < KW)[None, :]
    words = tl.load(w_ptr + rows[:, None] * KW + offs_w[None, :], mask=mask, other=0x55555555)
    dtype = out_ptr.dtype.element_ty
    vals = decode_pairs(words, dtype, INTERPRET).to(tl.float32)  # [BN, BKW * 16]
    scale = tl.load(s_ptr + rows[:, None] * G + (offs_w // GROUP_W)[None, :], mask=mask, other=0.0)  # [BN, BKW]
    vals = tl.reshape(vals, (BLOCK_N, BLOCK_KW, 16)) * scale.to(tl.float32)[:, :, None]
    offs_k = offs_w[:, None] * 16 + tl.arange(0, 16)[None, :]  # [BKW, 16]
    out = out_ptr + rows[:, None, None] * K + offs_k[None, :, :]
    tl.store(out, vals.to(dtype), mask=(rows < N)[:, None, None] & (offs_k < K)[None, :, :])


def dequantize(
    words: torch.Tensor,  # (N, K_pad // 16) int32
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    in_features: int,
    dtype: torch.dtype,
) -> torch.Tensor:  # (N, in_features) dtype
    n, kw = words.shape
    out = torch.empty((n, in_features), device=words.device, dtype=dtype)
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(kw, BLOCK_KW))
    _dequant_kernel[grid](
        words, scale, out, n, in_features, kw, scale.shape[1],
        GROUP_W=kw if group_size == -1 else group_size // 16, BLOCK_N=BLOCK_N, BLOCK_KW=BLOCK_KW,
        INTERPRET=interpreting(),
    )
    return out


def linear(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, group_size: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (M, K) -> (M, N)
    w = dequantize(words, scale, group_size, x.shape[-1], x.dtype)
    return torch.nn.functional.linear(x, w, bias)
