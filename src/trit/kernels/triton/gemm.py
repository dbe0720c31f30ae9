"""Tensor-core GEMM: ``y = x @ W.T`` for many rows of activations (prefill, and skinny batches of decode).

Each step decodes a ``[BLOCK_N, BLOCK_K]`` tile of ternary weights to bf16 (or
fp16) in registers, two values per 32-bit logic op
(:func:`trit.kernels.triton.codes.decode_pairs`), and feeds it to ``tl.dot``. Group scales are applied to
each step's partial product in fp32 (``BLOCK_K`` never spans two groups), or,
with one scale per row, once at the end. Split-K programs add up in the same
launch (:mod:`trit.kernels.triton.splitk`), for skinny M where output tiles are few.

Configs first, then the kernel, then the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton import splitk
from trit.kernels.triton.codes import decode_pairs, interpreting
from trit.kernels.triton.device import sm_count
from trit.kernels.triton.schedule import grouped_tile


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def as_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                "GROUP_M": self.group_m, "SPLIT_K": self.split_k, "num_warps": self.num_warps,
                "num_stages": self.num_stages}


def default_config(m: int, n: int, k: int, group_size: int) -> GemmConfig:
    block_k = 64 if group_size == fmt.PER_ROW or group_size >= 64 else group_size
    if m <= 16:
        cfg = GemmConfig(16, 64, block_k, 1, 4, 3)
    elif m <= 64:
        cfg = GemmConfig(64, 64, block_k, 8, 4, 3)
    else:
        cfg = GemmConfig(128, 128, block_k, 8, 8, 3)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split = 1
    while tiles * split < 2 * sm_count() and k // (block_k * split * 4) >= 1 and split < 8:
        split *= 2
    return GemmConfig(cfg.block_m, cfg.block_n, block_k, cfg.group_m, cfg.num_warps, cfg.num_stages, split)


def configs_for(m: int, group_size: int) -> tuple[GemmConfig, ...]:
    """The pruned search space for one M bucket: BLOCK_K never spans two groups."""
    ks = [k for k in (32, 64, 128) if fmt.steps_fit_groups(group_size, k)]
    if m <= 16:
        tiles = [(16, 64, 4, 3), (16, 128, 4, 3), (16, 256, 8, 3)]
        splits = (1, 4, 8)
    elif m <= 64:
        tiles = [(32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3)]
        splits = (1, 4)
    else:
        tiles = [(64, 128, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3), (128, 128, 4, 4)]
        splits = (1,)
    return tuple(GemmConfig(bm, bn, bk, 8, nw, st, sk) for bm, bn, nw, st in tiles for bk in ks[-2:]
                 for sk in splits)


@triton.jit
def _gemm_kernel(
    x_ptr,  # (M, K) bf16/fp16, row stride stride_xm
    w_ptr,  # (N, KW) int32 words
    s_ptr,  # (N, G) fp16/bf16 scales
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N) x.dtype, row stride N
    ws_ptr,  # (SPLIT_K, M, N) f32 split-K workspace (unused when SPLIT_K == 1)
    lock_ptr,  # int32 split-K counters, zero between calls
    M, N, K, KW, G, stride_xm,
    GROUP_K: tl.constexpr,  # inputs per scale; 0: one scale per row
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K == KW * 16, a multiple of BLOCK_K
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(KW * 16, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, KW * 16)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_w = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + offs_n[:, None] * KW + offs_w[None, :]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        if EVEN:  # N, K and the steps all whole: no masks
            words = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            words = tl.load(w_ptrs, mask=n_ok[:, None] & (offs_w < KW)[None, :], other=0x55555555)
            x = tl.load(x_ptrs, mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)  # [BM, BK]
        w = decode_pairs(words, dtype, INTERPRET)  # [BN, BK] in {-1, 0, 1}
        if INTERPRET:  # the CPU interpreter's bf16 dot is wrong: take the same values in fp32 there
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if GROUP_K == 0:
            acc = tl.dot(x, tl.trans(w), acc)
        else:
            scale = tl.load(s_ptr + offs_n * G + k0 // GROUP_K, mask=n_ok, other=0.0).to(tl.float32)
            acc += tl.dot(x, tl.trans(w)) * scale[None, :]
    if GROUP_K == 0:
        acc *= tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    splitk.store_or_reduce_tile(acc, y_ptr, ws_ptr, lock_ptr, b_ptr, offs_m, offs_n, M, N, pid, pid_k,
                                HAS_BIAS, SPLIT_K)


def gemm(
    x: torch.Tensor,  # (M, K) bf16/fp16, unit stride along K
    words: torch.Tensor,  # (N, K_pad // 16) int32
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:  # (M, N) x.dtype
    m, k = x.shape
    n, kw = words.shape
    assert x.stride(1) == 1 and words.is_contiguous() and scale.is_contiguous()
    cfg = config or default_config(m, n, k, group_size)
    assert fmt.steps_fit_groups(group_size, cfg.block_k), "BLOCK_K must not span two groups"
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    y, ws = splitk.outputs(x, n, cfg.split_k, tiles)
    _gemm_kernel[(tiles, cfg.split_k)](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, k, kw, scale.shape[1], x.stride(0),
        GROUP_K=0 if group_size == fmt.PER_ROW else group_size, HAS_BIAS=bias is not None, INTERPRET=interpreting(),
        EVEN=n % cfg.block_n == 0 and k == kw * 16 and k % (cfg.block_k * cfg.split_k) == 0,
        **cfg.as_kwargs(),
    )
    return y
