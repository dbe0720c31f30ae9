"""Tensor-core GEMM on weights repacked at load time into column pairs: ``y = x @ W.T`` for 16 to a few hundred rows.

The layout (made from a format-v1 layer by :func:`repack`; nothing on disk changes):

- ``words`` ``(K_pad // 8, N_pad // 2)`` int32: word ``(b, j)`` holds the codes of inputs ``8b .. 8b + 7``
  of output ``2j`` in its low half (input ``8b + i`` at bits ``2i``) and of output ``2j + 1`` in its
  high half (bits ``16 + 2i``). A row of words is ``N_pad / 2`` words of the same eight inputs, so a
  tile's load is contiguous along N.
- ``scale`` ``(G, N_pad)`` bf16 (or fp16, the activations' dtype): the group scales, transposed.

Decoding a word: shift right by ``2i``; one ``lop3`` keeps bits 0-1 and 16-17 and ORs in the
16-bit pattern of 128 (bf16) in both halves, which gives two 16-bit floats ``128 + c``: outputs ``2j``
and ``2j + 1`` of input ``8b + i``, side by side as the B tile ``[BLOCK_K, BLOCK_N]`` wants them. A
paired FMA makes them ``c - 1`` and a paired multiply by the two outputs' scales gives the
dequantized weights, the same bf16 values ``trit.format.dequantize`` rounded to bf16 gives (so the
same numbers as dequantize + cuBLAS). With the scale inside the weights, the MMAs accumulate
in place across the whole K loop: no step waits for its MMA to finish.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton import splitk
from trit.kernels.triton.codes import interpreting
from trit.kernels.triton.device import sm_count
from trit.kernels.triton.schedule import grouped_tile


@dataclass(frozen=True)
class PairedConfig:
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64  # never more than the group
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1

    def as_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "GROUP_M": self.group_m,
                "SPLIT_K": self.split_k, "num_warps": self.num_warps, "num_stages": self.num_stages}


@dataclass(frozen=True)
class Repacked:
    words: torch.Tensor  # (K_pad // 8, N_pad // 2) int32
    scale: torch.Tensor  # (G, N_pad) activations' dtype
    n: int
    k_pad: int
    group_size: int


def repack(packed: torch.Tensor, scale: torch.Tensor, group_size: int, dtype: torch.dtype = torch.bfloat16,
           rows: int = 4096) -> Repacked:
    """Format-v1 ``packed`` ``(N, K_pad // 4)`` uint8 and ``scale`` ``(N, G)`` -> the paired layout above.

    Done ``rows`` outputs at a time, so the temporary is a few tens of MB whatever the layer.
    """
    n, k_pad = packed.shape[0], packed.shape[1] * fmt.CODES_PER_BYTE
    if k_pad % 8:
        raise ValueError(f"K_pad = {k_pad} is not a multiple of 8")
    n_pad = n + n % 2
    words = torch.empty((k_pad // 8, n_pad // 2), dtype=torch.int32, device=packed.device)
    shifts = (2 * torch.arange(8, device=packed.device, dtype=torch.int64)
              + 16 * torch.arange(2, device=packed.device, dtype=torch.int64)[:, None])  # (2, 8)
    rows -= rows % 2
    for r0 in range(0, n, rows):
        codes = fmt.unpack_codes(packed[r0:r0 + rows]).to(torch.int64)  # (R, K_pad)
        if codes.shape[0] % 2:
            codes = torch.cat([codes, torch.ones_like(codes[:1])])  # a zero-weight row pads N to even
        c = codes.view(-1, 2, k_pad // 8, 8).permute(2, 0, 1, 3)  # (K/8, R/2, 2, 8)
        w = (c << shifts).sum((-1, -2))  # < 2**32
        words[:, r0 // 2: r0 // 2 + w.shape[1]] = (w - ((w >> 31) << 32)).to(torch.int32)  # as signed 32-bit
    st = scale.t().to(dtype)
    if n_pad != n:
        st = torch.cat([st, torch.zeros_like(st[:, :1])], 1)
    return Repacked(words, st.contiguous(), n, k_pad, group_size)


def _pair_bits(value: float, bf16: bool) -> int:
    t = torch.tensor([value], dtype=torch.bfloat16 if bf16 else torch.float16)
    assert t.item() == value, value
    return (int(t.view(torch.int16).item()) & 0xFFFF) * 0x10001


def _asm(bf16: bool, scaled: bool) -> str:
    """PTX for two weights, whichever two elements ``pack=2`` hands it: ``$1`` and ``$2`` are their words, each
    shifted so that its code sits in bits 0-1, ``$3`` their two scales; ``prmt`` puts the two low halves side by
    side, one ``lop3`` masks the codes and ORs in the pattern of 128 (bf16) or 1024 (fp16), a paired FMA takes
    129 (1025) off, and a second multiplies by the scales (adding -0.0, which changes nothing)."""
    base = 128.0 if bf16 else 1024.0
    t = "bf16x2" if bf16 else "f16x2"
    body = (f"prmt.b32 t, $1, $2, 0x5410; lop3.b32 t, t, 0x00030003, {_pair_bits(base, bf16):#010x}, 0xEA; "
            f"mov.b32 o, {_pair_bits(1.0, bf16):#010x}; mov.b32 a, {_pair_bits(-(base + 1.0), bf16):#010x}; ")
    if scaled:
        body += f"fma.rn.{t} t, t, o, a; mov.b32 z, 0x80008000; fma.rn.{t} $0, t, $3, z; "
    else:
        body += f"fma.rn.{t} $0, t, o, a; "
    return "{ .reg .b32 t, o, a, z; " + body + "}"


_ASM_BF16 = tl.constexpr(_asm(True, True))
_ASM_F16 = tl.constexpr(_asm(False, True))
_ASM_BF16_PLAIN = tl.constexpr(_asm(True, False))
_ASM_F16_PLAIN = tl.constexpr(_asm(False, False))


@triton.jit
def decode_scaled(words, s, DTYPE: tl.constexpr, SCALED: tl.constexpr, INTERPRET: tl.constexpr):
    """``[BK // 8, BN // 2]`` words and ``[BN]`` scales -> ``[BK, BN]`` DTYPE weights ``(c - 1) * s``."""
    RB: tl.constexpr = words.shape[0]
    C2: tl.constexpr = words.shape[1]
    shifts = 2 * tl.arange(0, 8)[:, None] + 16 * tl.arange(0, 2)[None, :]  # [8 (i), 2 (e)]
    sh = words[:, None, :, None] >> shifts[None, :, None, :]  # [RB, 8, C2, 2]: weight (8b + i, 2j + e) in bits 0-1
    s4 = tl.broadcast_to(tl.reshape(s, (1, 1, C2, 2)), (RB, 8, C2, 2))
    if INTERPRET:  # no inline assembly on the CPU interpreter: the same values from plain ops
        v = (sh & 3).to(tl.float32) - 1.0
        if SCALED:
            v = v * s4.to(tl.float32)
        v = v.to(DTYPE)
    else:
        if DTYPE.is_bf16():
            if SCALED:
                v = tl.inline_asm_elementwise(_ASM_BF16, "=r,r,r,r", [sh, s4], dtype=tl.bfloat16, is_pure=True, pack=2)
            else:
                v = tl.inline_asm_elementwise(_ASM_BF16_PLAIN, "=r,r,r", [sh], dtype=tl.bfloat16, is_pure=True,
                                              pack=2)
        else:
            if SCALED:
                v = tl.inline_asm_elementwise(_ASM_F16, "=r,r,r,r", [sh, s4], dtype=tl.float16, is_pure=True, pack=2)
            else:
                v = tl.inline_asm_elementwise(_ASM_F16_PLAIN, "=r,r,r", [sh], dtype=tl.float16, is_pure=True, pack=2)
    return tl.reshape(v, (RB * 8, C2 * 2))


@triton.jit
def _paired_kernel(
    x_ptr,  # (M, K) bf16/fp16, row stride stride_xm
    w_ptr,  # (K_pad // 8, N2) int32 words
    s_ptr,  # (G, 2 * N2) scales, activations' dtype
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N)
    ws_ptr, lock_ptr,  # split-K workspace and counters
    M, N, K, KP, N2, stride_xm,
    GROUP_K: tl.constexpr,  # inputs a scale (K_pad for one scale a row)
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,  # False: the weights undecorated by their scale (a timing ablation, wrong numbers)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN: tl.constexpr,  # N2 * 2 % BLOCK_N == 0, K == KP, a multiple of BLOCK_K * SPLIT_K
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    m_ok = offs_m < M
    j_ok = offs_j < N2
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(KP, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, KP)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_b = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + offs_b[:, None] * N2 + offs_j[None, :]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        s_ptrs = s_ptr + (k0 // GROUP_K) * (2 * N2) + offs_n
        if EVEN:
            words = tl.load(w_ptrs)
            s = tl.load(s_ptrs)
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            words = tl.load(w_ptrs, mask=(offs_b < KP // 8)[:, None] & j_ok[None, :], other=0x55555555)
            s = tl.load(s_ptrs, mask=offs_n < 2 * N2, other=0.0)
            x = tl.load(x_ptrs, mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        w = decode_scaled(words, s, dtype, SCALED, INTERPRET)  # [BK, BN]
        if INTERPRET:  # the CPU interpreter's bf16 dot is inexact: the same values in fp32
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
        else:
            acc = tl.dot(x, w, acc)
    splitk.store_or_reduce_tile(acc, y_ptr, ws_ptr, lock_ptr, b_ptr, offs_m, offs_n, M, N, pid, pid_k,
                                HAS_BIAS, SPLIT_K)


def default_config(m: int, n: int, k: int, group_size: int) -> PairedConfig:
    block_k = 64 if group_size == fmt.PER_ROW or group_size >= 64 else group_size
    if m <= 16:
        cfg = PairedConfig(16, 128, block_k, 1, 4, 4)
    elif m <= 64:
        cfg = PairedConfig(64, 128, block_k, 8, 4, 4)
    else:
        cfg = PairedConfig(128, 128, block_k, 8, 8, 3)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split = 1
    while tiles * split < 2 * sm_count() and k // (block_k * split * 4) >= 1 and split < 8:
        split *= 2
    return PairedConfig(cfg.block_m, cfg.block_n, block_k, cfg.group_m, cfg.num_warps, cfg.num_stages, split)


def paired(x: torch.Tensor, r: Repacked, bias: torch.Tensor | None = None, config: PairedConfig | None = None,
           scaled: bool = True) -> torch.Tensor:
    m, k = x.shape
    assert x.stride(1) == 1
    cfg = config or default_config(m, r.n, k, r.group_size)
    group_k = r.k_pad if r.group_size == fmt.PER_ROW else r.group_size
    assert group_k % cfg.block_k == 0, "BLOCK_K must not span two groups"
    n2 = r.words.shape[1]
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(r.n, cfg.block_n)
    y, ws = splitk.outputs(x, r.n, cfg.split_k, tiles)
    _paired_kernel[(tiles, cfg.split_k)](
        x, r.words, r.scale, bias if bias is not None else r.scale, y, ws, splitk.counters(x.device),
        m, r.n, k, r.k_pad, n2, x.stride(0),
        GROUP_K=group_k, HAS_BIAS=bias is not None, SCALED=scaled, INTERPRET=interpreting(),
        EVEN=(2 * n2) % cfg.block_n == 0 and r.n == 2 * n2 and k == r.k_pad and k % (cfg.block_k * cfg.split_k) == 0,
        **cfg.as_kwargs(),
    )
    return y
