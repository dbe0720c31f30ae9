"""Decode GEMV: ``y = x @ W.T`` for a few rows of activations (M <= 4), on CUDA cores, near memory bandwidth.

At M = 1 a ternary layer is read once per token, so the kernel must decode
2-bit codes faster than memory delivers them. On an NVIDIA GPU it decodes and
multiplies two weights at once, in 16-bit float halves (``PAIRED``, inline PTX,
one block per word). ``(word & 0x00030003 << p) | 0x64006400`` is two fp16
numbers ``1024 + c * 2**p`` (code ``i`` in the low half, code ``i + 8`` in the
high half, p in 0, 2, .., 8; the word shifted right by 10 serves codes 5-7 and
13-15). One ``fma.f16x2`` by ``2**-p`` less ``(1024 * 2**-p + 1)`` leaves
``c - 1`` in {-1, 0, 1} exactly, and a second adds it times the activation
pair into an fp16x2 sum of the word's eight pairs, which goes to f32 once a
word. Two weights cost one logic op and two FMAs. The activations enter fp16
scaled by ``2**-X_SHIFT[dtype]`` (undone on the row sums), so that a sum of
eight of them cannot overflow: fp16 activations by ``2**-3`` (never, as
``8 * 65504 / 8`` is fp16's largest number), bf16 ones by ``2**-4`` (bf16
activations past 65504 fit; a word's sum overflows only when its eight
activations of one sign add up past about ``10**6``). The price is at the small
end: activations below ``2**-11`` (fp16) or ``2**-10`` (bf16) become fp16
subnormals, with an absolute error of at most ``2**-22`` (``2**-21``) each.

Under ``TRITON_INTERPRET=1`` (the CPU tests, which cannot run PTX) the same
kernel decodes in f32 instead, from a float's mantissa: for a word shifted so
that code ``i`` sits at bits ``p, p + 1`` (p in 14, 16, 18, 20), one logic op
``(word & 3 << p) | 0x3F800000`` is the float ``1 + c * 2**(p - 23)``, one FMA
with the activation pre-scaled by ``2**(23 - p)`` adds ``x_s + x * c``, and the
``x_s`` and ``- x`` terms, which depend on the activations only, are summed
once per word and taken off before the group scale. That was the GPU path
before the paired one (``benchmarks/results/gemv-variants/``).

Each program owns ``BLOCK_N`` rows and a ``1 / SPLIT_K`` share of K; the next
step's words are loaded while the current step computes. The word sums of a
group are added up before its scale multiplies them (:func:`scale_mode`): a
scale is loaded and applied once a group and row, and the accumulator holds one
value a group of the step, not one a word. On the H200 that took the M = 1 time
summed over Llama-3-8B's layers from 58.7 to 44.4 us with the same configs
(``benchmarks/results/kernels.json``, against the run before it). Split-K programs add
up in the same launch (:mod:`trit.kernels.splitk`).

Configs first, then the kernel, then the launcher (the layout of gemlite's
kernel files).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit.kernels import decode, splitk

MAX_M = 4
ONE_BITS = 0x3F800000  # 1.0f
# the paired path takes the activations into fp16 scaled by 2**-X_SHIFT, the row sums back by 2**X_SHIFT
X_SHIFT = {torch.float16: 3, torch.bfloat16: 4}


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 32
    block_kw: int = 64  # int32 words (16 weights each) per row per step
    split_k: int = 1
    num_warps: int = 4

    def as_kwargs(self) -> dict:
        return {"BLOCK_N": self.block_n, "BLOCK_KW": self.block_kw, "SPLIT_K": self.split_k,
                "num_warps": self.num_warps}


def default_config(n: int, k: int, m: int) -> GemvConfig:
    """A config that fills an H100/H200-class GPU (132 SMs) for this shape, without tuning.

    The kernel is bound by handing each step's activations to the threads (shared memory and shuffles,
    as profiled on an H200), not by DRAM: large layers take 64 rows a program with 32-word steps, so
    more rows share each activation; small ones 16 rows with 64-word steps, for more programs.
    """
    kw = k // 16
    block_n = (64 if n >= 4096 else 16) if m <= 2 else 16
    block_kw = 32 if block_n == 64 else 64
    block_kw = block_kw if kw >= block_kw else max(triton.next_power_of_2(kw) // 2, 4)
    split = 1
    while (n // block_n) * split < 2 * 132 and kw // (block_kw * split * 2) >= 1 and split < 8:
        split *= 2
    return GemvConfig(block_n, block_kw, split, 4)


# the search space: rows a program, words a step, K splits, warps (pruned by hand to what can win)
CONFIGS = tuple(
    GemvConfig(bn, bkw, sk, nw)
    for bn, bkw, sk, nw in (
        (32, 64, 1, 4), (64, 64, 1, 4), (32, 64, 2, 4), (64, 64, 2, 4), (32, 64, 4, 4), (64, 64, 4, 8),
        (16, 64, 1, 4), (16, 128, 2, 4), (128, 64, 1, 8), (128, 64, 2, 8), (32, 128, 1, 8), (64, 64, 8, 4),
        # narrow steps over many rows: each step's activations are shared by more rows (see default_config)
        (64, 32, 1, 4), (64, 32, 2, 4), (64, 32, 4, 4), (128, 32, 1, 4), (128, 32, 2, 4), (32, 32, 2, 4),
        # one warp a program: no warp waits at a barrier for another's activations
        # (benchmarks/results/gemv-variants/sweep_warps.json)
        (32, 32, 1, 1), (32, 32, 2, 1), (32, 32, 4, 1), (32, 32, 8, 1), (16, 32, 1, 1), (16, 32, 2, 1),
        (16, 64, 2, 1),
    )
)


def _f16x2(v: float) -> str:
    """PTX immediate of the fp16 ``v`` in both halves of a 32-bit register."""
    (bits,) = struct.unpack("<H", struct.pack("<e", v))
    return f"0x{bits:04x}{bits:04x}"


def _word_ptx() -> str:
    """PTX: ``$0`` (f32) = word ``$1``'s 16 weights dotted with the f16x2 activation pairs ``$2..$9``.

    Pair ``j`` holds the activations of codes ``j`` (low half) and ``j + 8`` (high half), as the word holds them.
    """
    lines = ["{", ".reg .b32 w2, t, d, acc, sc, bi;", ".reg .b16 lo, hi;", ".reg .f32 flo, fhi;",
             "shr.u32 w2, $1, 10;"]
    for j in range(8):
        src, p = ("$1", 2 * j) if j < 5 else ("w2", 2 * (j - 5))
        lines += [f"lop3.b32 t, {src}, 0x{0x00030003 << p:08x}, 0x64006400, 0xea;",  # (a & b) | c: 1024 + c * 2**p
                  f"mov.b32 sc, {_f16x2(2.0 ** -p)};",
                  f"mov.b32 bi, {_f16x2(-(1024 * 2.0 ** -p + 1))};",
                  "fma.rn.f16x2 d, t, sc, bi;",  # c - 1, exact
                  f"mul.rn.f16x2 acc, d, ${2 + j};" if j == 0 else f"fma.rn.f16x2 acc, d, ${2 + j}, acc;"]
    lines += ["mov.b32 {lo, hi}, acc;", "cvt.f32.f16 flo, lo;", "cvt.f32.f16 fhi, hi;", "add.f32 $0, flo, fhi;", "}"]
    return "\n".join(lines)


WORD_PTX = tl.constexpr(_word_ptx())
PAIR_PTX = tl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")  # $0 = (hi: $2, lo: $1) in fp16


@triton.jit
def _pair(lo, hi):
    """Two f32 ``[BKW]`` -> one int32 ``[BKW]`` holding them as fp16 (lo in the low half)."""
    return tl.inline_asm_elementwise(PAIR_PTX, "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _split16(x):
    """``[B, 16]`` -> its 16 columns, each ``[B]`` (``tl.split`` halves the last dim each time)."""
    a, b = tl.split(tl.reshape(x, (x.shape[0], 8, 2)))
    a0, a1 = tl.split(tl.reshape(a, (x.shape[0], 4, 2)))
    b0, b1 = tl.split(tl.reshape(b, (x.shape[0], 4, 2)))
    a00, a01 = tl.split(tl.reshape(a0, (x.shape[0], 2, 2)))
    a10, a11 = tl.split(tl.reshape(a1, (x.shape[0], 2, 2)))
    b00, b01 = tl.split(tl.reshape(b0, (x.shape[0], 2, 2)))
    b10, b11 = tl.split(tl.reshape(b1, (x.shape[0], 2, 2)))
    c0, c8 = tl.split(a00)
    c4, c12 = tl.split(a01)
    c2, c10 = tl.split(a10)
    c6, c14 = tl.split(a11)
    c1, c9 = tl.split(b00)
    c5, c13 = tl.split(b01)
    c3, c11 = tl.split(b10)
    c7, c15 = tl.split(b11)
    return c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15


@triton.jit
def _window(words, i: tl.constexpr):
    """The word shifted so that code ``i`` sits at bit ``14 + 2 * (i % 4)``."""
    if i < 4:
        return words << 14
    elif i < 8:
        return words << 6
    elif i < 12:
        return words >> 2
    else:
        return words >> 10


@triton.jit
def _mac(part, window, x, i: tl.constexpr, one_bits):
    """part += x * c_i scaled in, as the module docstring derives: one LOP3 and one FMA a weight."""
    p: tl.constexpr = 14 + 2 * (i % 4)
    v = ((window & (3 << p)) | one_bits).to(tl.float32, bitcast=True)  # 1 + c * 2**(p - 23)
    return part + v * (x * (2.0 ** (23 - p)))[None, :]


@triton.jit
def _fix_weight(i: tl.constexpr):
    """What ``_mac`` adds for code ``i`` beyond ``x * (c - 1)``, per unit of x: ``2**(23 - p) + 1``."""
    return 2.0 ** (23 - (14 + 2 * (i % 4))) + 1.0


@triton.jit
def _dot_words(words, x_ptr, offs_w, w_ok, one_bits, PAIRED: tl.constexpr, X_SCALE: tl.constexpr):
    """``[BN, BKW]`` f32: each word's 16 weights (minus one) dotted with their 16 activations (times
    ``X_SCALE`` when ``PAIRED``: the kernel scales its row sums back).

    The activations of the step are one contiguous ``[BKW, 16]`` load (coalesced), split into columns.
    """
    offs_x = offs_w[:, None] * 16 + tl.arange(0, 16)[None, :]
    if w_ok is None:
        xt = tl.load(x_ptr + offs_x)
    else:
        xt = tl.load(x_ptr + offs_x, mask=w_ok[:, None], other=0.0)
    if PAIRED:
        xs = _split16(xt.to(tl.float32) * X_SCALE)
        return tl.inline_asm_elementwise(
            WORD_PTX, "=f,r,r,r,r,r,r,r,r,r",
            [words, _pair(xs[0], xs[8])[None, :], _pair(xs[1], xs[9])[None, :], _pair(xs[2], xs[10])[None, :],
             _pair(xs[3], xs[11])[None, :], _pair(xs[4], xs[12])[None, :], _pair(xs[5], xs[13])[None, :],
             _pair(xs[6], xs[14])[None, :], _pair(xs[7], xs[15])[None, :]],
            dtype=tl.float32, is_pure=True, pack=1)
    xs = _split16(xt.to(tl.float32))
    part = tl.zeros(words.shape, tl.float32)
    fix = tl.zeros(offs_w.shape, tl.float32)  # [BKW]: sum of x * (2**(23 - p) + 1), the same for every row
    for i in tl.static_range(16):
        part = _mac(part, _window(words, i), xs[i], i, one_bits)
        fix += xs[i] * _fix_weight(i)
    return part - fix[None, :]


@triton.jit
def _scaled(d, scale, SCALE_MODE: tl.constexpr, GROUP_W: tl.constexpr):
    """``[BN, BKW]`` word sums times their scales, as ``[BN, ACC_W]``: summed a group (or the step) first."""
    if SCALE_MODE == 0:
        return d * scale
    elif SCALE_MODE == 1:
        return tl.sum(tl.reshape(d, (d.shape[0], d.shape[1] // GROUP_W, GROUP_W)), axis=2) * scale
    else:
        return tl.sum(d, axis=1, keep_dims=True) * scale


@triton.jit
def _gemv_kernel(
    x_ptr,  # (M, K_pad) bf16/fp16, row stride stride_xm
    w_ptr,  # (N, KW) int32 words
    s_ptr,  # (N, G) fp16/bf16 scales
    b_ptr,  # (N,) bias or a dummy
    y_ptr,  # (M, N) x.dtype
    ws_ptr,  # (SPLIT_K, M, N) f32 split-K workspace (unused when SPLIT_K == 1)
    lock_ptr,  # int32 split-K counters, zero between calls
    M, N, KW, G, stride_xm,
    one_bits,  # 0x3F800000, an argument on purpose: the compiler keeps it in a register (see _mac)
    GROUP_W: tl.constexpr,  # words per group (KW for one scale per row)
    HAS_BIAS: tl.constexpr,
    M_ROWS: tl.constexpr,  # activation rows, 1..4
    BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and KW % (BLOCK_KW * SPLIT_K) == 0: no masks
    PAIRED: tl.constexpr,  # decode and multiply in fp16 pairs (inline PTX, NVIDIA only); f32 otherwise
    X_SCALE: tl.constexpr,  # 2**-X_SHIFT[x.dtype] when PAIRED, else 1; the row sums are scaled back by 1 / X_SCALE
    SCALE_MODE: tl.constexpr,  # 0: a scale a word; 1: BLOCK_KW % GROUP_W == 0; 2: a step inside one group
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    ACC_W: tl.constexpr = BLOCK_KW if SCALE_MODE == 0 else (BLOCK_KW // GROUP_W if SCALE_MODE == 1 else 1)
    acc0 = tl.zeros((BLOCK_N, ACC_W), tl.float32)
    acc1 = tl.zeros((BLOCK_N, ACC_W), tl.float32)
    acc2 = tl.zeros((BLOCK_N, ACC_W), tl.float32)
    acc3 = tl.zeros((BLOCK_N, ACC_W), tl.float32)
    offs_w = kw_start + tl.arange(0, BLOCK_KW)
    w_ptrs = w_ptr + rows[:, None] * KW + offs_w[None, :]
    if EVEN:
        words = tl.load(w_ptrs)
    else:
        words = tl.load(w_ptrs, mask=row_ok[:, None] & (offs_w < kw_end)[None, :], other=0x55555555)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        offs_w = kw0 + tl.arange(0, BLOCK_KW)
        # prefetch the next step's words while this one computes; the last step re-reads its own
        step = tl.multiple_of(tl.where(kw0 + BLOCK_KW < kw_end, BLOCK_KW, 0), BLOCK_KW)
        if SCALE_MODE == 0:  # a scale a word
            offs_s = offs_w // GROUP_W
        elif SCALE_MODE == 1:  # a scale a group, several groups a step
            offs_s = kw0 // GROUP_W + tl.arange(0, ACC_W)
        else:  # the step inside one group
            offs_s = kw0 // GROUP_W + tl.zeros((1,), tl.int32)
        if EVEN:
            w_ok = None
            words_next = tl.load(w_ptrs + step)
            scale = tl.load(s_ptr + rows[:, None] * G + offs_s[None, :])
        else:
            nxt = offs_w + step
            words_next = tl.load(w_ptrs + step, mask=row_ok[:, None] & (nxt < kw_end)[None, :], other=0x55555555)
            w_ok = offs_w < kw_end
            if SCALE_MODE == 0:
                s_ok = row_ok[:, None] & w_ok[None, :]
            elif SCALE_MODE == 1:
                s_ok = row_ok[:, None] & (offs_s * GROUP_W < kw_end)[None, :]
            else:
                s_ok = row_ok[:, None]
            scale = tl.load(s_ptr + rows[:, None] * G + offs_s[None, :], mask=s_ok, other=0.0)
        scale = scale.to(tl.float32)  # [BN, ACC_W]
        acc0 += _scaled(_dot_words(words, x_ptr, offs_w, w_ok, one_bits, PAIRED, X_SCALE), scale, SCALE_MODE,
                        GROUP_W)
        if M_ROWS > 1:
            acc1 += _scaled(_dot_words(words, x_ptr + stride_xm, offs_w, w_ok, one_bits, PAIRED, X_SCALE), scale,
                            SCALE_MODE, GROUP_W)
        if M_ROWS > 2:
            acc2 += _scaled(_dot_words(words, x_ptr + 2 * stride_xm, offs_w, w_ok, one_bits, PAIRED, X_SCALE),
                            scale, SCALE_MODE, GROUP_W)
        if M_ROWS > 3:
            acc3 += _scaled(_dot_words(words, x_ptr + 3 * stride_xm, offs_w, w_ok, one_bits, PAIRED, X_SCALE),
                            scale, SCALE_MODE, GROUP_W)
        words = words_next
        w_ptrs += step
    splitk.store_or_reduce(tl.sum(acc0, axis=1) * (1.0 / X_SCALE), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                           row_ok, 0, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 1)
    if M_ROWS > 1:
        splitk.store_or_reduce(tl.sum(acc1, axis=1) * (1.0 / X_SCALE), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 1, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 2)
    if M_ROWS > 2:
        splitk.store_or_reduce(tl.sum(acc2, axis=1) * (1.0 / X_SCALE), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 2, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 3)
    if M_ROWS > 3:
        splitk.store_or_reduce(tl.sum(acc3, axis=1) * (1.0 / X_SCALE), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 3, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, True)


def scale_mode(group_size: int, block_kw: int) -> int:
    """How a step meets its scales: 2 when it lies inside one group (one scale a row: its words are summed, then
    scaled), 1 when it holds whole groups (each group's words summed, then scaled), 0 otherwise (a scale a word).

    Steps start at multiples of ``block_kw`` words (split-K shares too), and groups at multiples of theirs.
    """
    group_w = group_size // 16
    if group_size == -1 or group_w % block_kw == 0:
        return 2
    return 1 if block_kw % group_w == 0 else 0


def paired(device: torch.device) -> bool:
    """Whether the kernel takes the fp16-pair path: PTX runs on NVIDIA GPUs, not in the CPU interpreter."""
    return device.type == "cuda" and torch.version.hip is None and not decode.interpreting()


def gemv(
    x: torch.Tensor,  # (M, K) bf16/fp16, M <= 4, unit stride along K
    words: torch.Tensor,  # (N, K_pad // 16) int32: the packed codes viewed as words
    scale: torch.Tensor,  # (N, G)
    group_size: int,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:  # (M, N) x.dtype
    m, k = x.shape
    n, kw = words.shape
    assert 1 <= m <= MAX_M and x.stride(1) == 1 and words.is_contiguous() and scale.is_contiguous()
    if k != kw * 16:  # zero columns past K meet the zero (padded) weights: no K masks
        x = torch.nn.functional.pad(x, (0, kw * 16 - k))
    cfg = config or default_config(n, k, m)
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    y, ws = splitk.outputs(x, n, cfg.split_k, grid[0])
    even = n % cfg.block_n == 0 and kw % (cfg.block_kw * cfg.split_k) == 0
    pair = paired(x.device)
    shift = X_SHIFT[x.dtype] if pair else 0
    _gemv_kernel[grid](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, kw, scale.shape[1], x.stride(0), ONE_BITS,
        GROUP_W=kw if group_size == -1 else group_size // 16, HAS_BIAS=bias is not None, M_ROWS=m, EVEN=even,
        PAIRED=pair, X_SCALE=2.0 ** -shift, SCALE_MODE=scale_mode(group_size, cfg.block_kw),
        **cfg.as_kwargs(),
    )
    return y
