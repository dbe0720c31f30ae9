"""Dequantize a ternary layer to a dense bf16/fp16 matrix on the GPU, for cuBLAS to multiply.

For long prefills (thousands of rows) the matmul is compute-bound and cuBLAS
runs the tensor cores near their peak; writing the dense weight once costs
``2 * N * K`` bytes, small beside ``2 * M * N * K`` flops when M is large. The
decode is :func:`trit.kernels.triton.codes.decode_pairs`, then one multiply by the
group scale, rounded once to the activation dtype.

Configs first, then the kernel, then the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton.codes import decode_pairs, interpreting


@dataclass(frozen=True)
class DequantConfig:
    block_n: int
    block_kw: int  # int32 words (16 weights each) per row per program
    num_warps: int
    k_fastest: bool  # consecutive programs walk along K (one row block's output), not down the rows


# without tuning: few rows, long runs of K, consecutive programs along K
DEFAULT = DequantConfig(block_n=4, block_kw=64, num_warps=4, k_fastest=True)
# the sweep space: rows a program, words a row, warps, grid order
CONFIGS = tuple(
    DequantConfig(bn, bkw, nw, kf)
    for bn, bkw, nw, kf in (
        (32, 8, 4, False), (32, 8, 4, True), (16, 16, 4, True), (8, 32, 4, True), (4, 64, 4, True),
        (16, 32, 4, True), (8, 64, 4, True), (16, 32, 8, True), (32, 32, 8, True), (16, 64, 8, True),
        (8, 32, 4, False), (16, 32, 4, False),
    )
)


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
    K_FASTEST: tl.constexpr,
):
    if K_FASTEST:
        pid_n, pid_k = tl.program_id(1), tl.program_id(0)
    else:
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = pid_k * BLOCK_KW + tl.arange(0, BLOCK_KW)
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
    out: torch.Tensor | None = None,  # (N, in_features) dtype, contiguous: written in place
    config: DequantConfig = DEFAULT,
) -> torch.Tensor:  # (N, in_features) dtype
    n, kw = words.shape
    if out is None:
        out = torch.empty((n, in_features), device=words.device, dtype=dtype)
    blocks_n, blocks_k = triton.cdiv(n, config.block_n), triton.cdiv(kw, config.block_kw)
    k_fastest = config.k_fastest and blocks_n < 65536  # the grid's second axis holds at most 65535
    grid = (blocks_k, blocks_n) if k_fastest else (blocks_n, blocks_k)
    _dequant_kernel[grid](
        words, scale, out, n, in_features, kw, scale.shape[1],
        GROUP_W=fmt.group_width(group_size, kw * 16) // 16, BLOCK_N=config.block_n, BLOCK_KW=config.block_kw,
        INTERPRET=interpreting(), K_FASTEST=k_fastest, num_warps=config.num_warps,
    )
    return out


def linear(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, group_size: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (M, K) -> (M, N)
    w = dequantize(words, scale, group_size, x.shape[-1], x.dtype)
    return torch.nn.functional.linear(x, w, bias)
