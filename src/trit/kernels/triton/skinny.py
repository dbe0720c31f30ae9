"""Skinny tensor-core GEMM: ``y = x @ W.T`` for decode batches (M up to 64), weights as the wide operand.

The problem is turned around: ``y.T = W @ x.T``, so that a block of
``BLOCK_N`` weight rows fills the tensor core's 64-row side and the few
activation rows its narrow side (M rounded up to 16, 32 or 64, padded with
zeros). Hopper's warpgroup MMA
then takes the decoded weights straight from registers, and the activations
from shared memory. Decoding is the only per-weight work: no multiply or add
per weight and per activation row, as on CUDA cores.

The decode writes each weight where the MMA's register fragment wants it. A
thread of the fragment holds, for each 16 inputs of a row, the slots
``2t, 2t+1, 2t+8, 2t+9`` (``t`` = lane % 4), two per 32-bit register. The
word of codes for those 16 inputs holds input ``16b + i`` at bits ``2i``
(:mod:`trit.format`). Shifted right by ``4t``, its bits 0-3 hold codes
``2t, 2t+1`` and bits 16-19 codes ``2t+8, 2t+9``; one logic op
``(w & 0x00030003 << 2h) | MAGIC`` makes the two 16-bit floats
``B + c * 2**(2h)`` from codes ``2t+h`` and ``2t+h+8`` (``B`` = 128 in bf16,
1024 in fp16), and one paired FMA turns them into ``c - 1``. So register
``(h)`` of a thread holds inputs ``2t+h`` and ``2t+h+8``, where the fragment's
own order would put ``2t+2h'`` and ``2t+2h'+1``: the activations are loaded in
the matching order instead (slot ``8h + 2t + e`` holds input
``8e + 2t + h``), and the dot product is unchanged. Per weight: a quarter
of a shift, half a logic op and half an FMA.

Each step covers ``BLOCK_K`` inputs inside one group: its partial product is
scaled by the group's scale in fp32 (one scale per row: once at the end). A
loop trip can take two steps (``steps``), whose MMAs are issued before the
first scaling waits for one.
Split-K programs add up in the same launch (:mod:`trit.kernels.triton.splitk`).

Configs first, then the kernel, then the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton import splitk
from trit.kernels.triton.codes import interpreting, split_halves

MAX_M = 64


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 128
    block_k: int = 64  # inputs a step: 32 or 64, never across two groups
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    steps: int = 1  # BLOCK_K steps a loop trip

    def as_kwargs(self) -> dict:
        return {"BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "SPLIT_K": self.split_k, "STEPS": self.steps,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


def block_m(m: int) -> int:
    """The MMA's narrow side: 16 at least, else M rounded up to a power of two."""
    return max(16, triton.next_power_of_2(m))


def block_k_for(group_size: int) -> int:
    return 64 if fmt.steps_fit_groups(group_size, 64) else 32


def default_config(m: int, n: int, k: int, group_size: int) -> SkinnyConfig:
    """Without tuning: 128 rows a program on large layers (64 on small ones), and K split until the programs
    fill the GPU about twice over (while each split keeps four steps or more)."""
    bk = block_k_for(group_size)
    block_n = 128 if n >= 4096 else 64
    steps = triton.cdiv(k, bk)
    split = 1
    while triton.cdiv(n, block_n) * split < 240 and steps // (split * 2) >= 4 and split < 16:
        split *= 2
    return SkinnyConfig(block_n, bk, split, 4, 3 if block_n == 128 else 4)


# the search space: 12 of the 13 configs that won a problem of the sweep above (64 rows, split 4, one sub-step was
# left out by oversight; the shipped table was tuned over these 12); block_k is set by the group
_SPACE = ((128, 8, 4, 3, 1), (128, 8, 4, 3, 2), (128, 4, 4, 3, 1), (128, 4, 4, 3, 2), (128, 8, 4, 5, 1),
          (128, 8, 4, 5, 2), (128, 2, 4, 5, 2), (128, 4, 8, 4, 1), (256, 2, 8, 4, 1), (64, 8, 4, 4, 1),
          (64, 16, 4, 4, 1), (64, 4, 4, 4, 2))


def configs_for(m: int, group_size: int) -> tuple[SkinnyConfig, ...]:
    bk = block_k_for(group_size)
    return tuple(SkinnyConfig(bn, bk, sk, nw, ns, st) for bn, sk, nw, ns, st in _SPACE)


def _pair_bits(value: float, bf16: bool) -> int:
    """The 32-bit pattern of ``value`` in both 16-bit halves (exact for the constants used)."""
    t = torch.tensor([value], dtype=torch.bfloat16 if bf16 else torch.float16)
    assert t.item() == value, value
    return (int(t.view(torch.int16).item()) & 0xFFFF) * 0x10001


def _pair_asm(h: int, bf16: bool) -> str:
    """PTX for one register of two weights: ``(w & 0x00030003 << 2h) | MAGIC``, then ``v * 2**-2h - (B * 2**-2h + 1)``."""
    base = 128.0 if bf16 else 1024.0
    magic = _pair_bits(base, bf16)
    mul, add = _pair_bits(1.0 / (1 << 2 * h), bf16), _pair_bits(-(base / (1 << 2 * h) + 1.0), bf16)
    fma = "fma.rn.bf16x2" if bf16 else "fma.rn.f16x2"
    return (f"{{ .reg .b32 m, a; lop3.b32 $0, $1, {0x00030003 << 2 * h:#010x}, {magic:#010x}, 0xEA; "
            f"mov.b32 m, {mul:#010x}; mov.b32 a, {add:#010x}; {fma} $0, $0, m, a; }}")


_ASM_BF16_0 = tl.constexpr(_pair_asm(0, True))
_ASM_BF16_1 = tl.constexpr(_pair_asm(1, True))
_ASM_F16_0 = tl.constexpr(_pair_asm(0, False))
_ASM_F16_1 = tl.constexpr(_pair_asm(1, False))


@triton.jit
def _code_pairs(shifted, H: tl.constexpr, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """``[...]`` int32 words -> ``[..., 2]`` DTYPE: ``c - 1`` of the codes at bits ``2H`` and ``16 + 2H``."""
    if INTERPRET:  # no inline assembly on the CPU interpreter: the same values from plain ops
        if DTYPE.is_bf16():
            magic: tl.constexpr = 0x43004300
            base: tl.constexpr = 128.0
        else:
            magic: tl.constexpr = 0x64006400
            base: tl.constexpr = 1024.0
        vals = split_halves((shifted & (0x00030003 << (2 * H))) | magic, DTYPE).to(tl.float32)
        return (vals * (1.0 / (1 << (2 * H))) - (base / (1 << (2 * H)) + 1.0)).to(DTYPE)
    else:
        twice = tl.join(shifted, shifted)  # pack=2 hands the asm two elements: the same word, for one register
        if DTYPE.is_bf16():
            if H == 0:
                return tl.inline_asm_elementwise(_ASM_BF16_0, "=r,r,r", [twice], dtype=tl.bfloat16, is_pure=True, pack=2)
            else:
                return tl.inline_asm_elementwise(_ASM_BF16_1, "=r,r,r", [twice], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            if H == 0:
                return tl.inline_asm_elementwise(_ASM_F16_0, "=r,r,r", [twice], dtype=tl.float16, is_pure=True, pack=2)
            else:
                return tl.inline_asm_elementwise(_ASM_F16_1, "=r,r,r", [twice], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def decode_fragment(words, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """``[R, W]`` int32 words -> ``[R, 16 W]`` DTYPE in {-1, 0, 1}, in the slot order of the module docstring."""
    R: tl.constexpr = words.shape[0]
    W: tl.constexpr = words.shape[1]
    shifted = words[:, :, None] >> (4 * tl.arange(0, 4))[None, None, :]  # [R, W, 4 (t)]
    v0 = _code_pairs(shifted, 0, DTYPE, INTERPRET)  # [R, W, t, e]: codes 2t + 8e
    v1 = _code_pairs(shifted, 1, DTYPE, INTERPRET)  # codes 2t + 1 + 8e
    v = tl.join(v0, v1)  # [R, W, t, e, h]
    return tl.reshape(tl.permute(v, (0, 1, 4, 2, 3)), (R, W * 16))  # slot 16b + 8h + 2t + e


def slot_order(block_k: int) -> list[int]:
    """The input each slot of :func:`decode_fragment` holds (what :func:`slot_order_x` does, on the host)."""
    return [(s & ~15) | ((s & 1) << 3) | (s & 6) | ((s >> 3) & 1) for s in range(block_k)]


@triton.jit
def slot_order_x(x):
    """``[R, BK]`` activations in natural order -> the same in slot order: slot ``16b + 8h + 2t + e`` takes
    input ``16b + 8e + 2t + h`` (swap bits 0 and 3 of the index within each 16)."""
    R: tl.constexpr = x.shape[0]
    BK: tl.constexpr = x.shape[1]
    x5 = tl.reshape(x, (R, BK // 16, 2, 4, 2))  # [R, b, e, t, h]
    return tl.reshape(tl.permute(x5, (0, 1, 4, 3, 2)), (R, BK))  # [R, b, h, t, e]


@triton.jit
def _step(w_ptrs, x_ptrs, s_ptrs, k0, offs_w, offs_k, n_ok, m_ok, K, KW, dtype: tl.constexpr,
          GROUP_K: tl.constexpr, EVEN: tl.constexpr, INTERPRET: tl.constexpr):
    """One ``BLOCK_K`` step: ``[BN, BM]`` f32 partial product of the decoded weights and the activations, and the
    step's group scales (``[BN]`` f32; ones with one scale per row)."""
    if EVEN:
        words = tl.load(w_ptrs)
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
    else:
        words = tl.load(w_ptrs, mask=n_ok[:, None] & (offs_w < KW)[None, :], other=0x55555555)
        x = tl.load(x_ptrs, mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    xt = tl.trans(slot_order_x(x))  # [BK, BM]: inputs in the slots' order
    w = decode_fragment(words, dtype, INTERPRET)  # [BN, BK]
    if INTERPRET:  # the CPU interpreter's bf16 dot is inexact: the same values in fp32
        w = w.to(tl.float32)
        xt = xt.to(tl.float32)
    if GROUP_K == 0:
        scale = tl.full((w.shape[0],), 1.0, tl.float32)
    elif EVEN:
        scale = tl.load(s_ptrs + k0 // GROUP_K).to(tl.float32)
    else:
        in_k = tl.full(n_ok.shape, k0, tl.int32) < KW * 16  # a second sub-step past the last word
        scale = tl.load(s_ptrs + k0 // GROUP_K, mask=n_ok & in_k, other=0.0).to(tl.float32)
    return tl.dot(w, xt), scale


@triton.jit
def _skinny_kernel(
    x_ptr,  # (M, K) bf16/fp16, row stride stride_xm
    w_ptr,  # (N, KW) int32 words
    s_ptr,  # (N, G) fp16/bf16 scales
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N) x.dtype
    ws_ptr,  # (SPLIT_K, M, N) f32 split-K workspace (unused when SPLIT_K == 1)
    lock_ptr,  # int32 split-K counters, zero between calls
    M, N, K, KW, G, stride_xm,
    GROUP_K: tl.constexpr,  # inputs per scale; 0: one scale per row
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,  # the MMA's narrow side: M rounded up, 16 at least
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STEPS: tl.constexpr,  # BLOCK_K steps a loop trip: 1 or 2
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K == KW * 16, a multiple of BLOCK_K * STEPS * SPLIT_K
    INTERPRET: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(KW * 16, SPLIT_K), BLOCK_K * STEPS) * (BLOCK_K * STEPS)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, KW * 16)
    offs_w = k_start // 16 + tl.arange(0, BLOCK_K // 16)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n[:, None] * KW + offs_w[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BM, BK], natural order
    s_ptrs = s_ptr + offs_n * G
    for k0 in range(k_start, k_end, BLOCK_K * STEPS):
        # STEPS sub-steps a trip: their MMAs are all issued before the first scaling waits for one
        d0, s0 = _step(w_ptrs, x_ptrs, s_ptrs, k0, offs_w, offs_k, n_ok, m_ok, K, KW, dtype, GROUP_K, EVEN, INTERPRET)
        if STEPS == 2:
            d1, s1 = _step(w_ptrs + BLOCK_K // 16, x_ptrs + BLOCK_K, s_ptrs, k0 + BLOCK_K, offs_w + BLOCK_K // 16,
                           offs_k + BLOCK_K, n_ok, m_ok, K, KW, dtype, GROUP_K, EVEN, INTERPRET)
        if GROUP_K == 0:
            acc += d0
            if STEPS == 2:
                acc += d1
        else:
            acc += d0 * s0[:, None]
            if STEPS == 2:
                acc += d1 * s1[:, None]
        w_ptrs += STEPS * (BLOCK_K // 16)
        x_ptrs += STEPS * BLOCK_K
        offs_w += STEPS * (BLOCK_K // 16)
        offs_k += STEPS * BLOCK_K
    if GROUP_K == 0:
        acc *= tl.load(s_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    splitk.store_or_reduce_tile(tl.trans(acc), y_ptr, ws_ptr, lock_ptr, b_ptr, offs_m, offs_n, M, N, pid_n, pid_k,
                                HAS_BIAS, SPLIT_K)


def skinny(
    x: torch.Tensor,  # (M, K) bf16/fp16, M <= MAX_M, unit stride along K
    words: torch.Tensor,  # (N, K_pad // 16) int32
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
) -> torch.Tensor:  # (M, N) x.dtype
    m, k = x.shape
    n, kw = words.shape
    assert 1 <= m <= MAX_M and x.stride(1) == 1 and words.is_contiguous() and scale.is_contiguous()
    cfg = config or default_config(m, n, k, group_size)
    assert fmt.steps_fit_groups(group_size, cfg.block_k), "BLOCK_K must not span two groups"
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    y, ws = splitk.outputs(x, n, cfg.split_k, grid[0])
    _skinny_kernel[grid](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, k, kw, scale.shape[1], x.stride(0),
        GROUP_K=0 if group_size == fmt.PER_ROW else group_size, HAS_BIAS=bias is not None, BLOCK_M=block_m(m),
        INTERPRET=interpreting(),
        EVEN=n % cfg.block_n == 0 and k == kw * 16 and k % (cfg.block_k * cfg.steps * cfg.split_k) == 0,
        **cfg.as_kwargs(),
    )
    return y
