"""An experiment, not shipped: a tensor-core GEMV for M <= 8 (mma.sync m16n8k16 in inline PTX), 2026-12-01.

Lane (g, t) of a warp (g = lane // 4, t = lane % 4, read from ``%tid.x``) owns
word 4c + t of chunk c (64 inputs, one group of 64) for rows g and g + 8 of
each 16-row tile. Pair i of a word (codes i and i + 8) sits at bits 2i and
16 + 2i; the windows w, w >> 6 and w >> 12 bring it to bits p = 2 (i % 3), and
``(window & 0x00030003 << p) | MAGIC_p``, MAGIC_p the 16-bit float 2**(E - p)
(E = 7 for bf16, 10 for fp16) in both halves, is the number 2**(E - p) + c: one
logic op a pair of weights, no float op. Step s of a chunk takes pairs 2s (A
registers a0, a1) and 2s + 1 (a2, a3); the B registers hold the activations of
the same codes of batch row g, as they are in memory (no conversion). The MMA
sums (2**(E - p) + c) x in f32; the same MMA over words of code 1 everywhere
gives Z = sum (2**(E - p) + 1) x, and (d - Z) * scale = scale * sum (c - 1) x.
Under ``TRITON_INTERPRET=1`` the MMA is rebuilt from the fragments with plain
tensor ops, which checks the fragment bookkeeping on a CPU.

Measured on the H200 against the shipped GEMV (``sweep_tc_gemv.json``; without
the one-chunk prefetch of words, scales and activations,
``tc_gemv_no_prefetch.patch`` and ``sweep_tc_gemv_no_prefetch.json``): slower
at M = 1 on every shape; at M = 4 faster than the skinny GEMM's times in
``kernels.json`` on the largest layer only. In a triton 3.6 compile (not kept)
most of its loop's instructions are per chunk (activations, Z, addresses,
scales), not per weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit.kernels import decode, splitk

MAX_M = 8


@dataclass(frozen=True)
class TcConfig:
    tiles: int = 2
    split_k: int = 1
    num_warps: int = 4

    @property
    def block_n(self) -> int:
        return 16 * self.tiles * self.num_warps


# MAGIC_p in both halves, p = 0, 2, 4: bf16 0x4300, 0x4200, 0x4100 (128, 32, 8); fp16 0x6400, 0x5C00, 0x5400
# (1024, 256, 64); the same plus one (code 1): bf16 0x4301, 0x4204, 0x4110; fp16 0x6401, 0x5C04, 0x5410
MMA_BF16 = tl.constexpr("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, "
                        "{$8,$9}, {$10,$11,$12,$13};")
MMA_F16 = tl.constexpr("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, "
                       "{$8,$9}, {$10,$11,$12,$13};")
X_LOAD = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $9, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
                      "mov.b32 $3, 0; mov.b32 $4, 0; mov.b32 $5, 0; mov.b32 $6, 0; mov.b32 $7, 0; "
                      "@p ld.global.nc.v4.b32 {$0,$1,$2,$3}, [$8]; @p ld.global.nc.v4.b32 {$4,$5,$6,$7}, [$8+16]; }")
TID = tl.constexpr("mov.u32 $0, %tid.x;")


@triton.jit
def _tid(L: tl.constexpr, INTERPRET: tl.constexpr):
    ar = tl.arange(0, L)
    if INTERPRET:
        return ar
    return tl.inline_asm_elementwise(TID, "=r,r", [ar], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _h(v, HI: tl.constexpr, BF16: tl.constexpr):
    """16-bit half of int32 ``v`` as f32 (interpreter)."""
    bits = (v >> 16) & 0xFFFF if HI else v & 0xFFFF
    if BF16:
        return (bits << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, W: tl.constexpr, BF16: tl.constexpr, INTERPRET: tl.constexpr):
    if not INTERPRET:
        if BF16:
            return tl.inline_asm_elementwise(MMA_BF16, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                                             [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
                                             dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                                             pack=1)
        return tl.inline_asm_elementwise(MMA_F16, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                                         [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
                                         dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    # the interpreter: rebuild the warp's A (16 x 16), B^T (8 x 16), multiply, hand D back by the PTX fragment layout
    top = tl.reshape(tl.join(tl.join(_h(a0, False, BF16), _h(a0, True, BF16)),
                             tl.join(_h(a2, False, BF16), _h(a2, True, BF16))), (W, 8, 4, 2, 2))
    bot = tl.reshape(tl.join(tl.join(_h(a1, False, BF16), _h(a1, True, BF16)),
                             tl.join(_h(a3, False, BF16), _h(a3, True, BF16))), (W, 8, 4, 2, 2))
    # [W, g, t, e, which] -> kappa = 8 * which + 2t + e
    top = tl.reshape(tl.permute(top, (0, 1, 4, 2, 3)), (W, 8, 16))
    bot = tl.reshape(tl.permute(bot, (0, 1, 4, 2, 3)), (W, 8, 16))
    a = tl.reshape(tl.permute(tl.join(top, bot), (0, 3, 1, 2)), (W, 16, 16))  # [W, row, kappa]
    bt = tl.reshape(tl.join(tl.join(_h(b0, False, BF16), _h(b0, True, BF16)),
                            tl.join(_h(b1, False, BF16), _h(b1, True, BF16))), (W, 8, 4, 2, 2))
    bt = tl.reshape(tl.permute(bt, (0, 1, 4, 2, 3)), (W, 8, 16))  # [W, n, kappa]
    d = tl.sum(a[:, :, None, :] * bt[:, None, :, :], axis=3)  # [W, 16, 8]
    d = tl.reshape(d, (W, 2, 8, 4, 2))  # [W, half, g, t, e]
    d = tl.permute(d, (0, 2, 3, 1, 4))  # [W, g, t, half, e]
    lo, hi = tl.split(d)  # e = 0 / 1: [W, g, t, half]
    d00, d10 = tl.split(lo)  # half 0 / 1
    d01, d11 = tl.split(hi)
    L: tl.constexpr = W * 32
    return (c0 + tl.reshape(d00, (L,)), c1 + tl.reshape(d01, (L,)), c2 + tl.reshape(d10, (L,)),
            c3 + tl.reshape(d11, (L,)))


@triton.jit
def _pair(win, P: tl.constexpr, BF16: tl.constexpr):
    if BF16:
        if P == 0:
            return (win & 0x00030003) | 0x43004300
        elif P == 2:
            return (win & 0x000C000C) | 0x42004200
        else:
            return (win & 0x00300030) | 0x41004100
    else:
        if P == 0:
            return (win & 0x00030003) | 0x64006400
        elif P == 2:
            return (win & 0x000C000C) | 0x5C005C00
        else:
            return (win & 0x00300030) | 0x54005400


@triton.jit
def _ones(P: tl.constexpr, BF16: tl.constexpr, like):
    if BF16:
        v: tl.constexpr = 0x43014301 if P == 0 else (0x42044204 if P == 2 else 0x41104110)
    else:
        v: tl.constexpr = 0x64016401 if P == 0 else (0x5C045C04 if P == 2 else 0x54105410)
    return tl.full(like.shape, v, tl.int32)


@triton.jit
def _tile_chunk(wl, wh, b0, b1, b2, b3, b4, b5, b6, b7, c0, c1, c2, c3, W: tl.constexpr, BF16: tl.constexpr,
                INTERPRET: tl.constexpr):
    """One 16-row tile, one chunk: d += A(words) B."""
    l1 = wl >> 6
    l2 = wl >> 12
    h1 = wh >> 6
    h2 = wh >> 12
    # pairs 0..7: windows (w, w, w, w>>6, w>>6, w>>6, w>>12, w>>12), p = 0, 2, 4, 0, 2, 4, 0, 2
    c0, c1, c2, c3 = _mma(_pair(wl, 0, BF16), _pair(wh, 0, BF16), _pair(wl, 2, BF16), _pair(wh, 2, BF16), b0, b1,
                          c0, c1, c2, c3, W, BF16, INTERPRET)
    c0, c1, c2, c3 = _mma(_pair(wl, 4, BF16), _pair(wh, 4, BF16), _pair(l1, 0, BF16), _pair(h1, 0, BF16), b2, b3,
                          c0, c1, c2, c3, W, BF16, INTERPRET)
    c0, c1, c2, c3 = _mma(_pair(l1, 2, BF16), _pair(h1, 2, BF16), _pair(l1, 4, BF16), _pair(h1, 4, BF16), b4, b5,
                          c0, c1, c2, c3, W, BF16, INTERPRET)
    c0, c1, c2, c3 = _mma(_pair(l2, 0, BF16), _pair(h2, 0, BF16), _pair(l2, 2, BF16), _pair(h2, 2, BF16), b6, b7,
                          c0, c1, c2, c3, W, BF16, INTERPRET)
    return c0, c1, c2, c3


@triton.jit
def _load_x(x_ptr, g, t, c, M, KW, stride_xm, BF16: tl.constexpr, INTERPRET: tl.constexpr):
    """Lane (g, t)'s eight words of activations for chunk c (word 4c + t, row g): v_i = inputs 2i, 2i + 1."""
    kw = c * 4 + t
    ok = (g < M) & (kw < KW)
    base = x_ptr + g * stride_xm + kw * 16
    if INTERPRET:
        v0 = _bits2(base, 0, ok, BF16)
        v1 = _bits2(base, 2, ok, BF16)
        v2 = _bits2(base, 4, ok, BF16)
        v3 = _bits2(base, 6, ok, BF16)
        v4 = _bits2(base, 8, ok, BF16)
        v5 = _bits2(base, 10, ok, BF16)
        v6 = _bits2(base, 12, ok, BF16)
        v7 = _bits2(base, 14, ok, BF16)
        return v0, v1, v2, v3, v4, v5, v6, v7
    addr = base.to(tl.int64, bitcast=True)
    return tl.inline_asm_elementwise(X_LOAD, "=r,=r,=r,=r,=r,=r,=r,=r,l,r", [addr, ok.to(tl.int32)],
                                     dtype=(tl.int32,) * 8, is_pure=True, pack=1)


@triton.jit
def _bits2(base, i: tl.constexpr, ok, BF16: tl.constexpr):
    lo = tl.load(base + i, mask=ok, other=0.0).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = tl.load(base + i + 1, mask=ok, other=0.0).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo | (hi << 16)


@triton.jit
def _bpair(va, vb, HI: tl.constexpr):
    """(half of va, same half of vb) as one register: inputs j and j + 8."""
    if HI:
        return ((va >> 16) & 0xFFFF) | (vb & -65536)
    return (va & 0xFFFF) | (vb << 16)


@triton.jit
def _tc_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, lock_ptr,
    M, N, KW, G, stride_xm,
    GROUP_C: tl.constexpr,  # chunks (64 inputs) a group; 0: one scale per row
    HAS_BIAS: tl.constexpr,
    TILES: tl.constexpr,  # 1 or 2
    SPLIT_K: tl.constexpr,
    BF16: tl.constexpr,
    INTERPRET: tl.constexpr,
    NW: tl.constexpr,
):
    L: tl.constexpr = 32 * NW
    tid = _tid(L, INTERPRET)
    lane = tid & 31
    warp = tid >> 5
    g = lane >> 2
    t = lane & 3
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    BLOCK_N: tl.constexpr = 16 * TILES * NW
    r0 = pid_n * BLOCK_N + warp * (16 * TILES) + g  # tile 0 rows r0, r0 + 8; tile 1 rows r0 + 16, r0 + 24
    nc = tl.cdiv(KW, 4)
    per = tl.cdiv(nc, SPLIT_K)
    c_start = pid_k * per
    c_end = tl.minimum(c_start + per, nc)
    zero = tl.zeros((L,), tl.float32)
    a00, a01, a02, a03 = zero, zero, zero, zero
    a10, a11, a12, a13 = zero, zero, zero, zero
    ok0 = r0 < N
    ok1 = (r0 + 8) < N
    ok2 = (r0 + 16) < N
    ok3 = (r0 + 24) < N
    v0, v1, v2, v3, v4, v5, v6, v7 = _load_x(x_ptr, g, t, c_start, M, KW, stride_xm, BF16, INTERPRET)
    wl0, wh0, sl0, sh0 = _load_tile(w_ptr, s_ptr, r0, c_start, t, KW, G, ok0, ok1, GROUP_C)
    wl1, wh1, sl1, sh1 = wl0, wh0, sl0, sh0
    if TILES == 2:
        wl1, wh1, sl1, sh1 = _load_tile(w_ptr, s_ptr, r0 + 16, c_start, t, KW, G, ok2, ok3, GROUP_C)
    for c in range(c_start, c_end):
        cn = tl.minimum(c + 1, c_end - 1)  # the next chunk's operands load while this one computes
        n0, n1, n2, n3, n4, n5, n6, n7 = _load_x(x_ptr, g, t, cn, M, KW, stride_xm, BF16, INTERPRET)
        nwl0, nwh0, nsl0, nsh0 = _load_tile(w_ptr, s_ptr, r0, cn, t, KW, G, ok0, ok1, GROUP_C)
        nwl1, nwh1, nsl1, nsh1 = nwl0, nwh0, nsl0, nsh0
        if TILES == 2:
            nwl1, nwh1, nsl1, nsh1 = _load_tile(w_ptr, s_ptr, r0 + 16, cn, t, KW, G, ok2, ok3, GROUP_C)
        b0 = _bpair(v0, v4, False)
        b1 = _bpair(v0, v4, True)
        b2 = _bpair(v1, v5, False)
        b3 = _bpair(v1, v5, True)
        b4 = _bpair(v2, v6, False)
        b5 = _bpair(v2, v6, True)
        b6 = _bpair(v3, v7, False)
        b7 = _bpair(v3, v7, True)
        # Z: every code 1
        z0, z1, z2, z3 = _mma(_ones(0, BF16, tid), _ones(0, BF16, tid), _ones(2, BF16, tid), _ones(2, BF16, tid),
                              b0, b1, zero, zero, zero, zero, NW, BF16, INTERPRET)
        z0, z1, z2, z3 = _mma(_ones(4, BF16, tid), _ones(4, BF16, tid), _ones(0, BF16, tid), _ones(0, BF16, tid),
                              b2, b3, z0, z1, z2, z3, NW, BF16, INTERPRET)
        z0, z1, z2, z3 = _mma(_ones(2, BF16, tid), _ones(2, BF16, tid), _ones(4, BF16, tid), _ones(4, BF16, tid),
                              b4, b5, z0, z1, z2, z3, NW, BF16, INTERPRET)
        z0, z1, z2, z3 = _mma(_ones(0, BF16, tid), _ones(0, BF16, tid), _ones(2, BF16, tid), _ones(2, BF16, tid),
                              b6, b7, z0, z1, z2, z3, NW, BF16, INTERPRET)
        d0, d1, d2, d3 = _tile_chunk(wl0, wh0, b0, b1, b2, b3, b4, b5, b6, b7, zero, zero, zero, zero, NW, BF16,
                                     INTERPRET)
        a00 += (d0 - z0) * sl0
        a01 += (d1 - z1) * sl0
        a02 += (d2 - z2) * sh0
        a03 += (d3 - z3) * sh0
        if TILES == 2:
            d0, d1, d2, d3 = _tile_chunk(wl1, wh1, b0, b1, b2, b3, b4, b5, b6, b7, zero, zero, zero, zero, NW, BF16,
                                         INTERPRET)
            a10 += (d0 - z0) * sl1
            a11 += (d1 - z1) * sl1
            a12 += (d2 - z2) * sh1
            a13 += (d3 - z3) * sh1
        v0, v1, v2, v3, v4, v5, v6, v7 = n0, n1, n2, n3, n4, n5, n6, n7
        wl0, wh0, sl0, sh0 = nwl0, nwh0, nsl0, nsh0
        wl1, wh1, sl1, sh1 = nwl1, nwh1, nsl1, nsh1
    # D layout: a*0 = (row g, batch 2t), a*1 = (row g, batch 2t + 1), a*2, a*3: row g + 8
    m0 = 2 * t
    m1 = 2 * t + 1
    _store(a00, y_ptr, ws_ptr, b_ptr, r0, m0, ok0 & (m0 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
    _store(a01, y_ptr, ws_ptr, b_ptr, r0, m1, ok0 & (m1 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
    _store(a02, y_ptr, ws_ptr, b_ptr, r0 + 8, m0, ok1 & (m0 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
    _store(a03, y_ptr, ws_ptr, b_ptr, r0 + 8, m1, ok1 & (m1 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
    if TILES == 2:
        _store(a10, y_ptr, ws_ptr, b_ptr, r0 + 16, m0, ok2 & (m0 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
        _store(a11, y_ptr, ws_ptr, b_ptr, r0 + 16, m1, ok2 & (m1 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
        _store(a12, y_ptr, ws_ptr, b_ptr, r0 + 24, m0, ok3 & (m0 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
        _store(a13, y_ptr, ws_ptr, b_ptr, r0 + 24, m1, ok3 & (m1 < M), M, N, pid_k, HAS_BIAS, SPLIT_K)
    if SPLIT_K > 1:
        tl.debug_barrier()
        ticket = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            _reduce(y_ptr, ws_ptr, b_ptr, r0, m0, ok0 & (m0 < M), M, N, HAS_BIAS, SPLIT_K)
            _reduce(y_ptr, ws_ptr, b_ptr, r0, m1, ok0 & (m1 < M), M, N, HAS_BIAS, SPLIT_K)
            _reduce(y_ptr, ws_ptr, b_ptr, r0 + 8, m0, ok1 & (m0 < M), M, N, HAS_BIAS, SPLIT_K)
            _reduce(y_ptr, ws_ptr, b_ptr, r0 + 8, m1, ok1 & (m1 < M), M, N, HAS_BIAS, SPLIT_K)
            if TILES == 2:
                _reduce(y_ptr, ws_ptr, b_ptr, r0 + 16, m0, ok2 & (m0 < M), M, N, HAS_BIAS, SPLIT_K)
                _reduce(y_ptr, ws_ptr, b_ptr, r0 + 16, m1, ok2 & (m1 < M), M, N, HAS_BIAS, SPLIT_K)
                _reduce(y_ptr, ws_ptr, b_ptr, r0 + 24, m0, ok3 & (m0 < M), M, N, HAS_BIAS, SPLIT_K)
                _reduce(y_ptr, ws_ptr, b_ptr, r0 + 24, m1, ok3 & (m1 < M), M, N, HAS_BIAS, SPLIT_K)
            tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _load_tile(w_ptr, s_ptr, r, c, t, KW, G, ok_lo, ok_hi, GROUP_C: tl.constexpr):
    """A tile's two words (rows r, r + 8) and their scales (f32) for chunk c."""
    kw = c * 4 + t
    kw_ok = kw < KW
    grp = 0 if GROUP_C == 0 else c // GROUP_C
    wl = tl.load(w_ptr + r * KW + kw, mask=ok_lo & kw_ok, other=0x55555555)
    wh = tl.load(w_ptr + (r + 8) * KW + kw, mask=ok_hi & kw_ok, other=0x55555555)
    sl = tl.load(s_ptr + r * G + grp, mask=ok_lo, other=0.0).to(tl.float32)
    sh = tl.load(s_ptr + (r + 8) * G + grp, mask=ok_hi, other=0.0).to(tl.float32)
    return wl, wh, sl, sh


@triton.jit
def _store(acc, y_ptr, ws_ptr, b_ptr, row, m, ok, M, N, pid_k, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + row, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * N + row, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(ws_ptr + (pid_k * M + m) * N + row, acc, mask=ok)


@triton.jit
def _reduce(y_ptr, ws_ptr, b_ptr, row, m, ok, M, N, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    total = tl.load(ws_ptr + m * N + row, mask=ok, other=0.0, cache_modifier=".cg")
    for kk in tl.static_range(1, SPLIT_K):
        total += tl.load(ws_ptr + (kk * M + m) * N + row, mask=ok, other=0.0, cache_modifier=".cg")
    if HAS_BIAS:
        total += tl.load(b_ptr + row, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * N + row, total.to(y_ptr.dtype.element_ty), mask=ok)


def tc_gemv(x, words, scale, group_size, bias=None, config=None):
    m, k = x.shape
    n, kw = words.shape
    assert 1 <= m <= MAX_M and (group_size == -1 or group_size % 64 == 0)
    if k != kw * 16 or x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = torch.nn.functional.pad(x, (0, kw * 16 - k)).contiguous()
    cfg = config or TcConfig()
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    y, ws = splitk.outputs(x, n, cfg.split_k, grid[0])
    _tc_gemv_kernel[grid](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, kw, scale.shape[1], x.stride(0),
        GROUP_C=0 if group_size == -1 else group_size // 64, HAS_BIAS=bias is not None, TILES=cfg.tiles,
        SPLIT_K=cfg.split_k, BF16=x.dtype == torch.bfloat16, INTERPRET=decode.interpreting(), NW=cfg.num_warps,
        num_warps=cfg.num_warps,
    )
    return y


GemvConfig = TcConfig  # for benchmarks/results/gemv-variants/sweep.py
gemv = tc_gemv
