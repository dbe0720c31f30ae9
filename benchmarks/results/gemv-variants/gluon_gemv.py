"""A Gluon GEMV for M <= 4 on NVIDIA (sm_90, triton 3.6), kept as an experiment: the shipped integer GEMV's
arithmetic with its data moved differently. Not shipped: no faster summed (the results README's second
2026-12-01 entry has its sweeps).

Against ``trit/kernels/gemv.py``'s PTX path:
- Each step's activations are rounded and packed once, in a compact layout (eight of a word a thread), and the
  eight int16 pairs of each word and ``-sum(xi)`` pass to the words' layout (four words of a row a thread)
  through shared memory, one 16-byte load a pair for four words. ``-sum(xi)`` enters the first ``dp2a`` as its
  accumulator instead of a subtraction.
- A block of inline PTX takes the four words of a scale group (``pack=4``) and chains each code position's
  ``dp2a`` over them: one shift-add reduction a group instead of one a word.
- The words go global -> shared through a ring of ``STAGES`` ``cp.async`` stages (the
  STAGES - 1 steps after the one computed in flight); the scales are loaded ``SD`` steps ahead (0: in their step).
- ``TILED=1``: the words repacked on the host (once a tensor, cached) as ``[N / BN, KW / BKW, BN, BKW]``, so that a
  step's tile is 16 KB of contiguous memory (even shapes only).

Knobs from the environment: ``STAGES`` (default 4), ``SD`` (0, 1 or 2; default 2), ``TILED`` (0 or 1; default 0).
``GemvConfig`` and ``gemv`` make it a variant file for ``sweep.py``. All 70 GEMV tests of
``tests/kernels/test_triton.py`` pass with it on the H200 (``SD=2``, ``STAGES=4``, untiled), through
``route_gemv.py``.
"""

from __future__ import annotations

import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from trit.kernels import splitk
from trit.kernels.gemv import MAGIC, PACK_PTX, XB, GemvConfig, default_config, scale_mode  # noqa: F401

STAGES = int(os.environ.get("STAGES", "4"))
SD = int(os.environ.get("SD", "2"))
TILE = os.environ.get("TILED", "0") == "1"


def words_ptx(pack: int) -> str:
    """PTX: ``$0 = 64 * sum((c - 1) * xi)`` over ``pack`` consecutive words of one row (one scale group), and
    ``$1 .. $(pack - 1)`` = 0. Operands, each ``pack`` registers: the words, the eight int16 activation pairs
    (pair ``2k + a`` holds activations ``8a + k`` (low half) and ``8a + 4 + k``), and ``-sum(xi)`` over the pack
    (the first register's is read)."""
    p = pack
    lines = ["{", ".reg .b32 m0, m1, m2, m3, t0, t1, t2, t3;"]
    for j in range(p):
        for k in range(4):
            acc = (f"${p + 9 * p}" if k == 0 else "0") if j == 0 else f"t{k}"
            lines += [f"and.b32 m{k}, ${p + j}, 0x{0x03030303 << (2 * k):08x};",
                      f"dp2a.lo.s32.u32 t{k}, ${p + p * (1 + 2 * k) + j}, m{k}, {acc};",
                      f"dp2a.hi.s32.u32 t{k}, ${p + p * (2 + 2 * k) + j}, m{k}, t{k};"]
    lines += ["shl.b32 t0, t0, 2;", "add.s32 t1, t0, t1;", "shl.b32 t1, t1, 2;", "add.s32 t2, t1, t2;",
              "shl.b32 t2, t2, 2;", "add.s32 $0, t2, t3;"]
    lines += [f"mov.b32 ${j}, 0;" for j in range(1, p)]
    return "\n".join(lines + ["}"])


_PTX = {p: words_ptx(p) for p in (1, 2, 4)}
_SPLIT_STORE = gluon.jit(splitk.store_or_reduce.fn)


@gluon.constexpr_function
def _ptx(pack):
    return _PTX[pack]


@gluon.constexpr_function
def _constraints(pack):
    return ",".join(["=r"] * pack + ["r"] * (10 * pack))


@gluon.jit
def _first(v, PACK: gl.constexpr):
    """``[BN, BKW]`` -> ``[BN, BKW // PACK]``: the first of every PACK consecutive columns (a register pick)."""
    if PACK > 1:
        B: gl.constexpr = v.shape[0]
        C: gl.constexpr = v.shape[1] // PACK
        v = gl.reshape(v, (B, C, PACK // 2, 2))
        v, _ = gl.split(v)
        if PACK > 2:
            v, _ = gl.split(v)
        v = gl.reshape(v, (B, C))
    return v


@gluon.jit
def _quantize(x, P, SX, PACK: gl.constexpr):
    """A step's activations ``x`` ``[BKW, 16]`` -> shared memory: ``P`` ``[8, BKW]`` int16 pairs, ``SX``
    ``[1, BKW]`` minus the integers' sum over each pack (at every word of it). Returns ``1 / s``."""
    B: gl.constexpr = x.shape[0]
    xf = x.to(gl.float32)
    amax = gl.max(gl.max(gl.abs(xf), axis=1), axis=0)
    eb = gl.maximum((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF, XB)  # biased exponent of max|x| (>= XB)
    s = ((XB + 253 - eb) << 23).to(gl.float32, bitcast=True)  # 2**(XB - 1 - floor(log2 max|x|))
    inv = ((eb + 1 - XB) << 23).to(gl.float32, bitcast=True)
    v = xf * s + MAGIC  # round(x * s) in the low mantissa bits
    sx = gl.sum(MAGIC - v, axis=1)  # [BKW]: -sum(xi) a word, exact
    q = gl.permute(gl.reshape(v.to(gl.int32, bitcast=True), (B, 2, 2, 4)), (0, 1, 3, 2))  # [w, a, k, b]
    lo, hi = gl.split(q)  # activations 8a + k and 8a + 4 + k
    p = gl.inline_asm_elementwise(PACK_PTX, "=r,r,r", [lo, hi], dtype=gl.int32, is_pure=True, pack=1)
    P.permute((1, 0)).store(gl.reshape(gl.permute(p, (0, 2, 1)), (B, 8)))  # pair 2k + a
    if PACK > 1:
        LS: gl.constexpr = gl.BlockedLayout([1, PACK], [32, 1], [gl.num_warps(), 1], [1, 0])
        gs = gl.convert_layout(gl.sum(gl.reshape(sx, (B // PACK, PACK)), axis=1), gl.SliceLayout(1, LS))
        SX.reshape((B // PACK, PACK)).store(gs.to(gl.int32)[:, None].broadcast_to((B // PACK, PACK)))
    else:
        SX.permute((1, 0)).store(sx.to(gl.int32)[:, None])
    return inv


@gluon.jit
def _dot(words, P, SX, LW: gl.constexpr, PACK: gl.constexpr):
    """``[BN, BKW // PACK]`` int32: each pack's ``64 * sum((c - 1) * xi)``, from the pairs in shared memory."""
    t = gl.inline_asm_elementwise(
        _ptx(PACK), _constraints(PACK),
        [words, P.slice(0, 1, 0).load(LW), P.slice(1, 1, 0).load(LW), P.slice(2, 1, 0).load(LW),
         P.slice(3, 1, 0).load(LW), P.slice(4, 1, 0).load(LW), P.slice(5, 1, 0).load(LW),
         P.slice(6, 1, 0).load(LW), P.slice(7, 1, 0).load(LW), SX.load(LW)],
        dtype=gl.int32, is_pure=True, pack=PACK)
    return _first(t, PACK)


@gluon.jit
def _load_x(x_ptr, offs_w, kw_end, EVEN: gl.constexpr, LX: gl.constexpr):
    offs_x = offs_w[:, None] * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, LX))[None, :]
    if EVEN:
        return gl.load(x_ptr + offs_x)
    return gl.load(x_ptr + offs_x, mask=(offs_w < kw_end)[:, None], other=0.0)


@gluon.jit
def _load_scale(s_row, rows_p_ok, cols_p, kws, kw_end, GROUP_W: gl.constexpr, SCALE_MODE: gl.constexpr,
                EVEN: gl.constexpr):
    """The scales of the step starting at word ``kws``, ``[BN, BKW // PACK]``, as f32."""
    if SCALE_MODE == 0:
        offs_s = (kws + cols_p) // GROUP_W
    elif SCALE_MODE == 1:
        offs_s = kws // GROUP_W + cols_p // GROUP_W
    else:
        offs_s = kws // GROUP_W + cols_p * 0
    if EVEN:
        scale = gl.load(s_row + offs_s)
    else:
        scale = gl.load(s_row + offs_s, mask=rows_p_ok & (kws + cols_p < kw_end), other=0.0)
    return scale.to(gl.float32)


@gluon.jit
def _row(acc, words, x, x_ptr, offs_x_next, kw_end, P, SX, scale, EVEN: gl.constexpr, LW: gl.constexpr,
         LX: gl.constexpr, PACK: gl.constexpr):
    """One activation row's step: quantize ``x``, dot with the words, scale; the row's next step is loaded."""
    x_next = _load_x(x_ptr, offs_x_next, kw_end, EVEN, LX)
    inv = _quantize(x, P, SX, PACK)
    acc += _dot(words, P, SX, LW, PACK).to(gl.float32) * (scale * (inv * (1.0 / 64)))
    return acc, x_next


@gluon.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, lock_ptr,
    M, N, KW, G, stride_xm,
    STAGES: gl.constexpr, SD: gl.constexpr, TILED: gl.constexpr, GROUP_W: gl.constexpr, HAS_BIAS: gl.constexpr, M_ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
    BLOCK_KW: gl.constexpr, SPLIT_K: gl.constexpr, EVEN: gl.constexpr, SCALE_MODE: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    LW: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])  # words: 4 of a row a thread
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [NW, 1], [1, 0])  # activations: 8 of a word a thread
    SUM_W: gl.constexpr = 1 if SCALE_MODE == 0 else (GROUP_W if SCALE_MODE == 1 else BLOCK_KW)
    PACK: gl.constexpr = 4 if SUM_W >= 4 else SUM_W
    SHL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    P = gl.allocate_shared_memory(gl.int32, [8, BLOCK_KW], SHL)
    SX = gl.allocate_shared_memory(gl.int32, [1, BLOCK_KW], SHL)

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))
    cols = gl.arange(0, BLOCK_KW, layout=gl.SliceLayout(0, LW))
    row_ok = rows < N
    words_per_split = gl.cdiv(gl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = gl.minimum(kw_start + words_per_split, KW)

    # the packs' rows and first columns, for their scales
    rows_p = _first(rows[:, None].broadcast_to((BLOCK_N, BLOCK_KW)), PACK)
    cols_p = _first(cols[None, :].broadcast_to((BLOCK_N, BLOCK_KW)), PACK)
    rows_p_ok = rows_p < N
    s_row = s_ptr + rows_p * G
    acc0 = rows_p.to(gl.float32) * 0.0
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0

    if TILED:  # [N / BN, KW / BKW, BN, BKW]: word kw of a tile row at tile offset kw * BN
        w_offs = pid_n * BLOCK_N * KW + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))[:, None] * BLOCK_KW + cols[None, :]
        TS: gl.constexpr = BLOCK_N
    else:
        w_offs = rows[:, None] * KW + cols[None, :]
        TS: gl.constexpr = 1
    offs_x = kw_start + gl.arange(0, BLOCK_KW, layout=gl.SliceLayout(1, LX))
    W_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_KW], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for i in gl.static_range(STAGES - 1):
        kwi = kw_start + i * BLOCK_KW
        async_copy.async_copy_global_to_shared(W_s.index(i), w_ptr + kwi * TS + w_offs,
                                               mask=row_ok[:, None] & (kwi + cols < kw_end)[None, :])
        async_copy.commit_group()
    x0 = _load_x(x_ptr, offs_x, kw_end, EVEN, LX)
    x1 = x0
    x2 = x0
    x3 = x0
    if M_ROWS > 1:
        x1 = _load_x(x_ptr + stride_xm, offs_x, kw_end, EVEN, LX)
    if M_ROWS > 2:
        x2 = _load_x(x_ptr + 2 * stride_xm, offs_x, kw_end, EVEN, LX)
    if M_ROWS > 3:
        x3 = _load_x(x_ptr + 3 * stride_xm, offs_x, kw_end, EVEN, LX)
    n_steps = gl.cdiv(kw_end - kw_start, BLOCK_KW)
    s_a = _load_scale(s_row, rows_p_ok, cols_p, kw_start, kw_end, GROUP_W, SCALE_MODE, False)
    s_b = s_a
    if SD == 2:
        s_b = _load_scale(s_row, rows_p_ok, cols_p, kw_start + BLOCK_KW, kw_end, GROUP_W, SCALE_MODE, False)
    for i in range(n_steps):
        kw0 = kw_start + i * BLOCK_KW
        kwn = kw0 + (STAGES - 1) * BLOCK_KW
        async_copy.async_copy_global_to_shared(W_s.index((i + STAGES - 1) % STAGES), w_ptr + kwn * TS + w_offs,
                                               mask=row_ok[:, None] & (kwn + cols < kw_end)[None, :])
        async_copy.commit_group()
        step = gl.multiple_of(gl.where(kw0 + BLOCK_KW < kw_end, BLOCK_KW, 0), BLOCK_KW)
        # scales SD steps ahead (clamped to the last step when unmasked), or (SD = 0) this step's
        kws = kw0 + SD * BLOCK_KW
        if SD == 0:
            kws = kw0
        if EVEN:
            kws = gl.minimum(kws, kw_end - BLOCK_KW)
        s_new = _load_scale(s_row, rows_p_ok, cols_p, kws, kw_end, GROUP_W, SCALE_MODE, EVEN)
        async_copy.wait_group(STAGES - 1)
        words = W_s.index(i % STAGES).load(LW)
        scale = s_a
        if SD == 0:
            scale = s_new
        elif SD == 2:
            s_a = s_b
            s_b = s_new
        else:
            s_a = s_new
        offs_x = kw0 + step + gl.arange(0, BLOCK_KW, layout=gl.SliceLayout(1, LX))
        acc0, x0 = _row(acc0, words, x0, x_ptr, offs_x, kw_end, P, SX, scale, EVEN, LW, LX, PACK)
        if M_ROWS > 1:
            acc1, x1 = _row(acc1, words, x1, x_ptr + stride_xm, offs_x, kw_end, P, SX, scale, EVEN, LW, LX, PACK)
        if M_ROWS > 2:
            acc2, x2 = _row(acc2, words, x2, x_ptr + 2 * stride_xm, offs_x, kw_end, P, SX, scale, EVEN, LW, LX,
                            PACK)
        if M_ROWS > 3:
            acc3, x3 = _row(acc3, words, x3, x_ptr + 3 * stride_xm, offs_x, kw_end, P, SX, scale, EVEN, LW, LX,
                            PACK)
    LO: gl.constexpr = gl.SliceLayout(1, LW)
    _SPLIT_STORE(gl.convert_layout(gl.sum(acc0, axis=1), LO), y_ptr, ws_ptr, lock_ptr, b_ptr, rows, row_ok, 0, M, N,
                 pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 1)
    if M_ROWS > 1:
        _SPLIT_STORE(gl.convert_layout(gl.sum(acc1, axis=1), LO), y_ptr, ws_ptr, lock_ptr, b_ptr, rows, row_ok, 1,
                     M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 2)
    if M_ROWS > 2:
        _SPLIT_STORE(gl.convert_layout(gl.sum(acc2, axis=1), LO), y_ptr, ws_ptr, lock_ptr, b_ptr, rows, row_ok, 2,
                     M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, M_ROWS == 3)
    if M_ROWS > 3:
        _SPLIT_STORE(gl.convert_layout(gl.sum(acc3, axis=1), LO), y_ptr, ws_ptr, lock_ptr, b_ptr, rows, row_ok, 3,
                     M, N, pid_n, pid_k, HAS_BIAS, SPLIT_K, M_ROWS, True)


_TILES = {}


def gemv(x, words, scale, group_size, bias=None, config=None):
    m, k = x.shape
    n, kw = words.shape
    if k != kw * 16:
        x = torch.nn.functional.pad(x, (0, kw * 16 - k))
    cfg = config or default_config(n, k, m)
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    y, ws = splitk.outputs(x, n, cfg.split_k, grid[0])
    even = n % cfg.block_n == 0 and kw % (cfg.block_kw * cfg.split_k) == 0
    tiled = even and TILE
    if tiled:
        key = (words.data_ptr(), n, kw, cfg.block_n, cfg.block_kw)
        t = _TILES.get(key)
        if t is None:
            t = _TILES[key] = (words.view(n // cfg.block_n, cfg.block_n, kw // cfg.block_kw, cfg.block_kw)
                               .permute(0, 2, 1, 3).contiguous())
        words = t
    _gemv_kernel[grid](
        x, words, scale, bias if bias is not None else scale, y, ws, splitk.counters(x.device),
        m, n, kw, scale.shape[1], x.stride(0),
        STAGES=STAGES, SD=SD, TILED=tiled, GROUP_W=kw if group_size == -1 else group_size // 16, HAS_BIAS=bias is not None, M_ROWS=m, EVEN=even,
        SCALE_MODE=scale_mode(group_size, cfg.block_kw), BLOCK_N=cfg.block_n, BLOCK_KW=cfg.block_kw,
        SPLIT_K=cfg.split_k, num_warps=cfg.num_warps,
    )
    return y
