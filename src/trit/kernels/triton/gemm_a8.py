"""W1.58A8 on int8 tensor cores: BitNet's int8 per-token activations times ternary weights, for prefill.

The activations are rounded per token in one launch
(:func:`trit.kernels.triton.quantize.quantize_rows`). ``_gemm_a8``
decodes a ``[BLOCK_N, BLOCK_K]`` tile of ternary codes to int8 in registers,
multiplies it with the int8 activations by ``tl.dot`` into int32 (exact: the
sums are integers), and scales once per group in fp32 (with one scale per row,
once at the end): ``y = acc * w_scale[n] / s[m] + bias``. On Hopper int8
tensor cores run at twice the bf16 rate, and the activations are half the
bytes. The decode kernels (M <= 4) keep their bf16 path on ``x_q / s``.

Decoding in the GEMM's inner loop costs a few integer ops per weight per
row-block of M, which outweighs the int8 MMA once M is large. For long
prefills with one scale per row (every imported BitNet model), ``dense_a8``
instead writes the codes once as a dense int8 ``(N, K_pad)`` matrix (``N *
K_pad`` bytes, small beside ``2 * M * N * K`` ops) and runs a plain int8 x int8
GEMM (``_mm_a8``) with the scales in its epilogue.

Configs first, then the kernels, then the launchers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton.codes import decode_i8
from trit.kernels.triton.quantize import quantize_rows
from trit.kernels.triton.schedule import grouped_tile


@dataclass(frozen=True)
class GemmA8Config:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def as_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                "GROUP_M": self.group_m, "num_warps": self.num_warps, "num_stages": self.num_stages}


def default_config(m: int, n: int, k: int, group_size: int) -> GemmA8Config:
    block_k = 128 if fmt.steps_fit_groups(group_size, 128) else 64 if group_size % 64 == 0 else 32
    if m <= 64:
        return GemmA8Config(64, 64, block_k, 8, 4, 3)
    return GemmA8Config(128, 128, block_k, 8, 8, 3)


def configs_for(m: int, group_size: int) -> tuple[GemmA8Config, ...]:
    ks = [k for k in (64, 128) if fmt.steps_fit_groups(group_size, k)] or [32]
    tiles = [(64, 64, 4, 3), (64, 128, 4, 3)] if m <= 64 else [(128, 128, 8, 3), (128, 256, 8, 3), (128, 128, 4, 4)]
    return tuple(GemmA8Config(bm, bn, bk, 8, nw, st) for bm, bn, nw, st in tiles for bk in ks)


@triton.jit
def _gemm_a8_kernel(
    q_ptr,  # (M, K) int8 activations
    sx_ptr,  # (M,) f32 activation scales (127 / max|x|)
    w_ptr,  # (N, KW) int32 words of codes
    s_ptr,  # (N, G) weight scales
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N) output dtype
    M, N, K, KW, G,
    GROUP_K: tl.constexpr,  # inputs per scale; 0: one scale per row
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc_i = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, KW * 16, BLOCK_K):
        offs_w = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        words = tl.load(w_ptr + offs_n[:, None] * KW + offs_w[None, :],
                        mask=n_ok[:, None] & (offs_w < KW)[None, :], other=0x55555555)  # [BN, BK/16]
        w = tl.reshape(decode_i8(words), (BLOCK_N, BLOCK_K))  # {-1, 0, 1}
        x = tl.load(q_ptr + offs_m[:, None] * K + offs_k[None, :],
                    mask=m_ok[:, None] & (offs_k < K)[None, :], other=0)  # [BM, BK] int8
        if GROUP_K == 0:
            acc_i = tl.dot(x, tl.trans(w), acc_i, out_dtype=tl.int32)
        else:
            part = tl.dot(x, tl.trans(w), out_dtype=tl.int32)
            scale = tl.load(s_ptr + offs_n * G + k0 // GROUP_K, mask=n_ok, other=0.0).to(tl.float32)
            acc += part.to(tl.float32) * scale[None, :]
    if GROUP_K == 0:
        acc = acc_i.to(tl.float32) * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    _store_rows_scaled(acc, sx_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok, N, HAS_BIAS)


@triton.jit
def _store_rows_scaled(acc, sx_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok, N, HAS_BIAS: tl.constexpr):
    """The epilogue of both int8 kernels: ``acc / s[m] + bias``, stored in the output dtype."""
    acc = acc / tl.load(sx_ptr + offs_m, mask=m_ok, other=1.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _codes_int8_kernel(
    w_ptr,  # (N, KW) int32 words
    out_ptr,  # (N, KW * 16) int8 in {-1, 0, 1}
    N, KW,
    BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * BLOCK_KW + tl.arange(0, BLOCK_KW)
    mask = (rows < N)[:, None] & (offs_w < KW)[None, :]
    words = tl.load(w_ptr + rows[:, None] * KW + offs_w[None, :], mask=mask, other=0x55555555)
    offs_k = offs_w[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + rows[:, None, None] * (KW * 16) + offs_k[None, :, :], decode_i8(words),  # [BN, BKW, 16]
             mask=mask[:, :, None])


@triton.jit
def _mm_a8_kernel(
    q_ptr,  # (M, K) int8 activations
    sx_ptr,  # (M,) f32 activation scales
    w_ptr,  # (N, KP) int8 weights in {-1, 0, 1}
    s_ptr,  # (N, 1) weight scales
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N) output dtype
    M, N, K, KP,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(q_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
        w = tl.load(w_ptr + offs_n[:, None] * KP + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        acc = tl.dot(x, tl.trans(w), acc, out_dtype=tl.int32)
    out = acc.to(tl.float32) * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    _store_rows_scaled(out, sx_ptr, b_ptr, y_ptr, offs_m, offs_n, m_ok, n_ok, N, HAS_BIAS)


def codes_int8(words: torch.Tensor) -> torch.Tensor:
    """(N, KW) int32 words -> (N, KW * 16) int8 values in {-1, 0, 1}."""
    n, kw = words.shape
    out = torch.empty((n, kw * 16), device=words.device, dtype=torch.int8)
    _codes_int8_kernel[(triton.cdiv(n, 32), triton.cdiv(kw, 8))](words, out, n, kw, BLOCK_N=32, BLOCK_KW=8)
    return out


def dense_a8(
    x: torch.Tensor,  # (M, K) bf16/fp16/fp32, unit stride along K
    words: torch.Tensor,  # (N, K_pad // 16) int32
    scale: torch.Tensor,  # (N, 1): one scale per row
    group_size: int,
    bias: torch.Tensor | None = None,
    config: GemmA8Config | None = None,
) -> torch.Tensor:  # (M, N) x.dtype
    m, k = x.shape
    n, kw = words.shape
    assert group_size == fmt.PER_ROW and x.stride(1) == 1 and words.is_contiguous(), "one scale per row only"
    cfg = config or GemmA8Config(128, 256, 128, 8, 8, 3)
    q, s = quantize_rows(x)
    w = codes_int8(words)
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _mm_a8_kernel[grid](q, s, w, scale, bias if bias is not None else scale, y, m, n, k, kw * 16,
                        HAS_BIAS=bias is not None, **cfg.as_kwargs())
    return y


def dense_configs() -> tuple[GemmA8Config, ...]:
    return (GemmA8Config(128, 256, 128, 8, 8, 3), GemmA8Config(128, 128, 128, 8, 8, 4),
            GemmA8Config(256, 128, 128, 8, 8, 3), GemmA8Config(128, 256, 64, 8, 8, 4),
            GemmA8Config(128, 128, 128, 8, 4, 4))


def gemm_a8(
    x: torch.Tensor,  # (M, K) bf16/fp16/fp32, unit stride along K
    words: torch.Tensor,  # (N, K_pad // 16) int32
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,
    config: GemmA8Config | None = None,
) -> torch.Tensor:  # (M, N) x.dtype
    m, k = x.shape
    n, kw = words.shape
    assert x.stride(1) == 1 and words.is_contiguous() and scale.is_contiguous()
    cfg = config or default_config(m, n, k, group_size)
    assert fmt.steps_fit_groups(group_size, cfg.block_k), "BLOCK_K must not span two groups"
    q, s = quantize_rows(x)
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _gemm_a8_kernel[grid](
        q, s, words, scale, bias if bias is not None else scale, y, m, n, k, kw, scale.shape[1],
        GROUP_K=0 if group_size == fmt.PER_ROW else group_size, HAS_BIAS=bias is not None, **cfg.as_kwargs(),
    )
    return y
