"""Decode GEMV: ``y = x @ W.T`` for a few rows of activations (M <= 4), on CUDA cores, near memory bandwidth.

At M = 1 a ternary layer is read once per token, so the kernel must decode
2-bit codes faster than memory delivers them. On an NVIDIA GPU (``PTX``) it
multiplies in integers, two weights an instruction. Each step, every
activation row is rounded to integers ``xi`` of at most ``XB`` bits against
the step's largest activation (``x ~= xi * inv``, ``inv`` a power of two:
activations within ``2**(XB - 8)`` of the largest keep every bit of a bf16),
and packed two to a 32-bit register. A word of 16 codes meets them in one
block of inline PTX: ``word & 0x03030303 << 2k`` leaves in byte ``b`` the code
``c`` (0..2) of weight ``4b + k``, times ``4**k``; ``dp2a.lo`` multiplies bytes
0 and 1 with a pair of int16 activations and adds, ``dp2a.hi`` bytes 2 and 3.
Four such chains (k = 0..3) are joined as ``((t0 * 4 + t1) * 4 + t2) * 4 + t3
= 64 * sum(c * xi)``: four logic ops, eight ``dp2a`` and three shift-adds a
word, where the fp16-pair decode before it spent a logic op and two FMAs a
pair of weights. The words' integer sums are added up a group (or a step) in
int32 (at most ``INT_WORDS`` = 32 of them, so that no sum reaches 2**31), and
``64 * sum(xi)`` (the same for every row) is taken off once a group to turn
codes ``c`` into weights ``c - 1``.

Under ``TRITON_INTERPRET=1`` (the CPU tests, which cannot run PTX) the same
kernel decodes in f32 instead, from a float's mantissa: for a word shifted so
that code ``i`` sits at bits ``p, p + 1`` (p in 14, 16, 18, 20), one logic op
``(word & 3 << p) | 0x3F800000`` is the float ``1 + c * 2**(p - 23)``, one FMA
with the activation pre-scaled by ``2**(23 - p)`` adds ``x_s + x * c``, and the
``x_s`` and ``- x`` terms, which depend on the activations only, are summed
once per word and taken off before the group scale. The PTX strings are
checked on the CPU by an emulator (``tests/kernels/test_gemv_ptx.py``).

Each program owns ``BLOCK_N`` rows and a ``1 / SPLIT_K`` share of K; the next
step's words and activations are loaded while the current step computes. A
scale is loaded and applied once a group and row (:func:`scale_mode`).
Split-K programs add up in the same launch (:mod:`trit.kernels.triton.splitk`).
Designs measured and not kept are listed in docs/kernels.md ("Tried, and why
it lost"); their sweeps are in the git history.

Configs first, then the kernel, then the launcher (the layout of gemlite's
kernel files).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit import format as fmt
from trit.kernels.triton import codes, splitk
from trit.kernels.triton.device import sm_count

MAX_M = 4
ONE_BITS = 0x3F800000  # 1.0f
MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + MAGIC holds round(x) in its low mantissa bits


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
    """A config that fills the GPU (two programs an SM, :func:`~trit.kernels.triton.device.sm_count`) for this shape,
    without tuning.

    The kernel is bound by handing each step's activations to the threads (shared memory and shuffles,
    as profiled on an H200), not by DRAM: large layers take 64 rows a program with 32-word steps, so
    more rows share each activation; small ones 16 rows with 64-word steps, for more programs.
    """
    kw = k // 16
    block_n = (64 if n >= 4096 else 16) if m <= 2 else 16
    block_kw = 32 if block_n == 64 else 64
    block_kw = block_kw if kw >= block_kw else max(triton.next_power_of_2(kw) // 2, 4)
    split = 1
    while (n // block_n) * split < 2 * sm_count() and kw // (block_kw * split * 2) >= 1 and split < 8:
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
        (32, 32, 1, 1), (32, 32, 2, 1), (32, 32, 4, 1), (32, 32, 8, 1), (16, 32, 1, 1), (16, 32, 2, 1),
        (16, 64, 2, 1),
    )
)


# activations become integers of at most XB bits (sign aside); words' sums are added in int32 INT_WORDS at a time:
# a word's 64 * sum(c * xi) is below 64 * 16 * 2 * 2**XB = 2**25, INT_WORDS of them below 2**30
XB = tl.constexpr(14)
INT_WORDS = tl.constexpr(32)


def _word_ptx() -> str:
    """PTX: ``$0`` (s32) = ``64 * sum(c * xi)`` over word ``$1``'s 16 codes ``c`` (0..2), with the int16
    activation pairs ``$2..$9``: pair ``2k`` holds the activations of codes ``k`` (low half) and ``4 + k``, pair
    ``2k + 1`` those of codes ``8 + k`` and ``12 + k``. Four short chains, not one long one: a dp2a waits for
    the one before it."""
    lines = ["{", ".reg .b32 m0, m1, m2, m3, t0, t1, t2, t3;"]
    for k in range(4):
        lines += [f"and.b32 m{k}, $1, 0x{0x03030303 << (2 * k):08x};",  # byte b: c of weight 4b + k, times 4**k
                  f"dp2a.lo.s32.u32 t{k}, ${2 + 2 * k}, m{k}, 0;",
                  f"dp2a.hi.s32.u32 t{k}, ${3 + 2 * k}, m{k}, t{k};"]
    lines += ["shl.b32 t0, t0, 2;", "add.s32 t1, t0, t1;", "shl.b32 t1, t1, 2;", "add.s32 t2, t1, t2;",
              "shl.b32 t2, t2, 2;", "add.s32 $0, t2, t3;", "}"]  # ((t0 * 4 + t1) * 4 + t2) * 4 + t3
    return "\n".join(lines)


WORD_PTX = tl.constexpr(_word_ptx())
PACK_PTX = tl.constexpr("prmt.b32 $0, $1, $2, 0x5410;")  # the low 16 bits of $1 (low half) and of $2 (high)


@triton.jit
def _pack(lo, hi):
    """Two int32 ``[BKW]`` -> one, their low 16 bits side by side (lo in the low half)."""
    return tl.inline_asm_elementwise(PACK_PTX, "=r,r,r", [lo, hi], dtype=tl.int32, is_pure=True, pack=1)


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
def _dot_words(words, xt, one_bits):
    """Interpreter path: ``[BN, BKW]`` f32, each word's 16 weights (minus one) dotted with their 16 activations
    (``xt``: the step's ``[BKW, 16]``)."""
    xs = _split16(xt.to(tl.float32))
    part = tl.zeros(words.shape, tl.float32)
    fix = tl.zeros((xt.shape[0],), tl.float32)  # [BKW]: sum of x * (2**(23 - p) + 1), the same for every row
    for i in tl.static_range(16):
        part = _mac(part, _window(words, i), xs[i], i, one_bits)
        fix += xs[i] * _fix_weight(i)
    return part - fix[None, :]


@triton.jit
def _sums(d, W: tl.constexpr):
    """``[BN, BKW]`` -> ``[BN, BKW // W]``: sums of W consecutive words."""
    return tl.sum(tl.reshape(d, (d.shape[0], d.shape[1] // W, W)), axis=2)


@triton.jit
def _scaled(d, scale, SUM_W: tl.constexpr):
    """``[BN, BKW]`` word sums times their scales, as ``[BN, BKW // SUM_W]``: a group's (or the step's) summed
    first."""
    if SUM_W > 1:
        d = _sums(d, SUM_W)
    return d * scale


@triton.jit
def _int_sums(t, W: tl.constexpr):
    """``[BN, BKW]`` int32 word sums -> ``[BN, BKW // W]`` f32 sums of W consecutive words, added in int32
    ``INT_WORDS`` at a time."""
    if W <= INT_WORDS:
        sums = _sums(t, W).to(tl.float32)
    else:
        parts = tl.sum(tl.reshape(t, (t.shape[0], t.shape[1] // W, W // INT_WORDS, INT_WORDS)), axis=3)
        sums = tl.sum(parts.to(tl.float32), axis=2)
    return sums


@triton.jit
def _int_dot(words, xt, scale, SUM_W: tl.constexpr):
    """PTX path: the step's ``[BN, BKW // SUM_W]`` f32 contribution, as the module docstring derives.

    ``xt`` (the step's ``[BKW, 16]`` activations) becomes integers ``xi`` under a power-of-two scale ``s`` with
    ``max|x| * s < 2**XB``; each word's ``64 * sum(c * xi)`` comes from :data:`WORD_PTX`, summed in int32 a
    group (or the step), less ``64 * sum(xi)``, times ``scale / (64 * s)``.
    """
    xt = xt.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(xt), axis=1), axis=0)
    eb = tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF, XB)  # biased exponent of max|x| (>= XB)
    s = ((XB + 253 - eb) << 23).to(tl.float32, bitcast=True)  # 2**(XB - 1 - floor(log2 max|x|))
    inv = ((eb + 1 - XB) << 23).to(tl.float32, bitcast=True)  # 1 / s
    v = xt * s + MAGIC  # round(x * s) in the low mantissa bits
    sx = tl.sum(v - MAGIC, axis=1) * 64.0  # [BKW]: 64 * sum(xi) a word, exact in f32
    c = _split16(v.to(tl.int32, bitcast=True))
    t = tl.inline_asm_elementwise(
        WORD_PTX, "=r,r,r,r,r,r,r,r,r,r",
        [words, _pack(c[0], c[4])[None, :], _pack(c[8], c[12])[None, :], _pack(c[1], c[5])[None, :],
         _pack(c[9], c[13])[None, :], _pack(c[2], c[6])[None, :], _pack(c[10], c[14])[None, :],
         _pack(c[3], c[7])[None, :], _pack(c[11], c[15])[None, :]],
        dtype=tl.int32, is_pure=True, pack=1)
    scale = scale * (inv * (1.0 / 64))
    if SUM_W == 1:
        d = t.to(tl.float32) - sx[None, :]
    else:
        d = _int_sums(t, SUM_W) - tl.sum(tl.reshape(sx, (sx.shape[0] // SUM_W, SUM_W)), axis=1)[None, :]
    return d * scale


@triton.jit
def _step(words, xt, scale, one_bits, SUM_W: tl.constexpr, PTX: tl.constexpr):
    """One activation row's ``[BN, BKW // SUM_W]`` contribution from the step's words."""
    if PTX:
        return _int_dot(words, xt, scale, SUM_W)
    return _scaled(_dot_words(words, xt, one_bits), scale, SUM_W)


@triton.jit
def _load_x(x_ptr, offs_w, kw_end, EVEN: tl.constexpr):
    """A step's activations, one contiguous ``[BKW, 16]`` load (zeros past the share's end)."""
    offs_x = offs_w[:, None] * 16 + tl.arange(0, 16)[None, :]
    if EVEN:
        return tl.load(x_ptr + offs_x)
    return tl.load(x_ptr + offs_x, mask=(offs_w < kw_end)[:, None], other=0.0)


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
    PTX: tl.constexpr,  # integer dot products in inline PTX (NVIDIA only); f32 otherwise
    SCALE_MODE: tl.constexpr,  # 0: a scale a word; 1: BLOCK_KW % GROUP_W == 0; 2: a step inside one group
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    SUM_W: tl.constexpr = 1 if SCALE_MODE == 0 else (GROUP_W if SCALE_MODE == 1 else BLOCK_KW)  # words a scale
    ACC_W: tl.constexpr = BLOCK_KW // SUM_W
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
    x0 = _load_x(x_ptr, offs_w, kw_end, EVEN)
    x1 = x0
    x2 = x0
    x3 = x0
    if M_ROWS > 1:
        x1 = _load_x(x_ptr + stride_xm, offs_w, kw_end, EVEN)
    if M_ROWS > 2:
        x2 = _load_x(x_ptr + 2 * stride_xm, offs_w, kw_end, EVEN)
    if M_ROWS > 3:
        x3 = _load_x(x_ptr + 3 * stride_xm, offs_w, kw_end, EVEN)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        offs_w = kw0 + tl.arange(0, BLOCK_KW)
        # prefetch the next step's words and activations while this one computes; the last step re-reads its own
        step = tl.multiple_of(tl.where(kw0 + BLOCK_KW < kw_end, BLOCK_KW, 0), BLOCK_KW)
        if SCALE_MODE == 0:  # a scale a word
            offs_s = offs_w // GROUP_W
        elif SCALE_MODE == 1:  # a scale a group, several groups a step
            offs_s = kw0 // GROUP_W + tl.arange(0, ACC_W)
        else:  # the step inside one group
            offs_s = kw0 // GROUP_W + tl.zeros((1,), tl.int32)
        if EVEN:
            words_next = tl.load(w_ptrs + step)
            scale = tl.load(s_ptr + rows[:, None] * G + offs_s[None, :])
        else:
            nxt = offs_w + step
            words_next = tl.load(w_ptrs + step, mask=row_ok[:, None] & (nxt < kw_end)[None, :], other=0x55555555)
            if SCALE_MODE == 0:
                s_ok = row_ok[:, None] & (offs_w < kw_end)[None, :]
            elif SCALE_MODE == 1:
                s_ok = row_ok[:, None] & (offs_s * GROUP_W < kw_end)[None, :]
            else:
                s_ok = row_ok[:, None]
            scale = tl.load(s_ptr + rows[:, None] * G + offs_s[None, :], mask=s_ok, other=0.0)
        scale = scale.to(tl.float32)  # [BN, ACC_W]
        x_next = _load_x(x_ptr, offs_w + step, kw_end, EVEN)
        acc0 += _step(words, x0, scale, one_bits, SUM_W, PTX)
        x0 = x_next
        if M_ROWS > 1:
            x_next = _load_x(x_ptr + stride_xm, offs_w + step, kw_end, EVEN)
            acc1 += _step(words, x1, scale, one_bits, SUM_W, PTX)
            x1 = x_next
        if M_ROWS > 2:
            x_next = _load_x(x_ptr + 2 * stride_xm, offs_w + step, kw_end, EVEN)
            acc2 += _step(words, x2, scale, one_bits, SUM_W, PTX)
            x2 = x_next
        if M_ROWS > 3:
            x_next = _load_x(x_ptr + 3 * stride_xm, offs_w + step, kw_end, EVEN)
            acc3 += _step(words, x3, scale, one_bits, SUM_W, PTX)
            x3 = x_next
        words = words_next
        w_ptrs += step
    splitk.store_or_reduce(tl.sum(acc0, axis=1), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                           row_ok, 0, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 1)
    if M_ROWS > 1:
        splitk.store_or_reduce(tl.sum(acc1, axis=1), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 1, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 2)
    if M_ROWS > 2:
        splitk.store_or_reduce(tl.sum(acc2, axis=1), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 2, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 3)
    if M_ROWS > 3:
        splitk.store_or_reduce(tl.sum(acc3, axis=1), y_ptr, ws_ptr, lock_ptr, b_ptr, rows,
                               row_ok, 3, M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, True)


def scale_mode(group_size: int, block_kw: int) -> int:
    """How a step meets its scales: 2 when it lies inside one group (one scale a row: its words are summed, then
    scaled), 1 when it holds whole groups (each group's words summed, then scaled), 0 otherwise (a scale a word).

    Steps start at multiples of ``block_kw`` words (split-K shares too), and groups at multiples of theirs.
    """
    if group_size == fmt.PER_ROW or (group_size // 16) % block_kw == 0:
        return 2
    group_w = group_size // 16
    return 1 if block_kw % group_w == 0 else 0


def ptx_path(device: torch.device) -> bool:
    """Whether the kernel takes the integer path: PTX runs on NVIDIA GPUs, not in the CPU interpreter."""
    return device.type == "cuda" and torch.version.hip is None and not codes.interpreting()


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
    _gemv_kernel[grid](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, kw, scale.shape[1], x.stride(0), ONE_BITS,
        GROUP_W=fmt.group_width(group_size, kw * 16) // 16, HAS_BIAS=bias is not None, M_ROWS=m, EVEN=even,
        PTX=ptx_path(x.device), SCALE_MODE=scale_mode(group_size, cfg.block_kw),
        **cfg.as_kwargs(),
    )
    return y
