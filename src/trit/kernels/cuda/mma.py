"""The tensor-core GEMM on a layout made at load time (``mma.cu``), any M (the tuned tables say where it wins).

The layout
----------
The checkpoint's codes (format v1, packed along K) are rearranged once, when a
layer is loaded, into the order the MMA's A fragments want (``m16n8k16``, W as
the A operand, 16 output rows a tile). For row tile ``T`` (rows ``16T..16T+15``),
128-input step ``S`` and lane ``l`` (``g = l // 4``, ``t = l % 4``), one 16-byte
vector ``wq[T, S, l]`` holds four 32-bit words; word ``j`` covers inputs
``128S + 32j`` to ``+32``, that is two k16 steps ``s``, and in it register
``q = 4s + r`` of the A fragment sits in bits ``2q`` (its first element) and
``16 + 2q`` (its second):

    r = 0: row g,     inputs 16s + 2t, +1      r = 1: row g + 8, the same inputs
    r = 2: row g,     inputs 16s + 2t + 8, +9  r = 3: row g + 8, the same inputs

each as the code ``c = w + 1`` of format v1. Scales become bf16 pairs
``sc[T, group, g] = (s[16T + g], s[16T + g + 8])``. N is padded to 16 rows and K
to 128 inputs with zero weights (scale 0). The packed codes stay 2 bits a
weight; the scales are stored once, in bf16 (the precision the dequantized bf16
weight has in any case). :func:`unpack_layout` rebuilds the dense weight from
this layout with the kernel's index arithmetic, in plain PyTorch: the CPU tests
check the layout with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path

import torch

from trit import format as fmt

SOURCE_FILE = Path(__file__).with_name("mma.cu")
ROW_TILE = 16
K_STEP = 128
WARPS = 4
MAX_M = 64  # without a tuned choice, the mma kernel takes up to this many rows, dequantize + cuBLAS the rest
TUNE_MAX_M = 256  # `trit bench kernels` times it against dequantize + cuBLAS up to this many rows
TOKEN_TILES = (1, 2, 4, 8)  # tiles of 8 tokens a block; above 64 tokens, blocks take slices of M
GROUPS = (32, 64, 128, fmt.PER_ROW)


@lru_cache(maxsize=1)
def source() -> str:
    return SOURCE_FILE.with_name("common.cuh").read_text() + "\n" + SOURCE_FILE.read_text()


@dataclass(frozen=True)
class MmaWeights:
    """One layer in the mma layout: ``wq`` (NT, KS, 32, 4) int32, ``sc`` (NT, GP, 8) int32."""

    wq: torch.Tensor
    sc: torch.Tensor
    n: int
    k: int
    group_size: int

    @property
    def row_tiles(self) -> int:
        return self.wq.shape[0]

    @property
    def k_steps(self) -> int:
        return self.wq.shape[1]

    @property
    def scale_groups(self) -> int:
        return self.sc.shape[1]


def _index_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row within the tile and input within the 128-step for (lane, word, register q)."""
    lane = torch.arange(32, device=device).view(32, 1, 1)
    word = torch.arange(4, device=device).view(1, 4, 1)
    q = torch.arange(8, device=device).view(1, 1, 8)
    g, t = lane // 4, lane % 4
    s, r = q // 4, q % 4
    rows = (g + 8 * (r % 2)).expand(32, 4, 8)
    cols = 32 * word + 16 * s + 2 * t + 8 * (r // 2)
    return rows, cols


def tiles(n: int, k: int) -> tuple[int, int]:
    """Row tiles and 128-input steps of an (N, K) layer in the layout (N and K padded up)."""
    return -(-n // ROW_TILE), -(-k // K_STEP)


def grid(row_tiles: int, k_steps: int, warps: int, rt: int, ki: int) -> tuple[int, int]:
    """Blocks of ``warps`` x ``rt`` row tiles, and chunks of ``ki`` steps, that cover a layer."""
    return -(-row_tiles // (warps * rt)), -(-k_steps // ki)


def repack(packed: torch.Tensor, scale: torch.Tensor, group_size: int, in_features: int | None = None) -> MmaWeights:
    """Format-v1 ``packed`` (N, K_pad // 4) uint8 and ``scale`` (N, G) -> the mma layout (same device)."""
    n, k_pad = packed.shape[0], packed.shape[1] * 4
    k = in_features if in_features is not None else k_pad
    if group_size not in GROUPS:
        raise ValueError(f"the mma layout takes groups of {GROUPS}, not {group_size}")
    dev = packed.device
    nt, ks = tiles(n, k_pad)
    codes = torch.ones(nt * ROW_TILE, ks * K_STEP, dtype=torch.int32, device=dev)
    codes[:n, :k_pad] = fmt.unpack_codes(packed).to(torch.int32)
    c5 = codes.view(nt, ROW_TILE, ks, K_STEP).permute(0, 2, 1, 3)  # (NT, KS, 16, 128)
    rows, cols = _index_tables(dev)
    lo, hi = c5[:, :, rows, cols], c5[:, :, rows, cols + 1]  # (NT, KS, 32, 4, 8)
    shift = 2 * torch.arange(8, device=dev, dtype=torch.int32)
    words = ((lo << shift) | (hi << (shift + 16))).sum(-1, dtype=torch.int64)  # disjoint bits: sum is OR
    wq = words.to(torch.int64).where(words < 2**31, words - 2**32).to(torch.int32).contiguous()

    width = fmt.group_width(group_size, k_pad)
    gp = 1 if group_size == fmt.PER_ROW else -(-(ks * K_STEP) // width)
    s = torch.zeros(nt * ROW_TILE, gp, dtype=torch.bfloat16, device=dev)
    s[:n, : scale.shape[1]] = scale.to(torch.bfloat16)
    bits = s.view(torch.int16).to(torch.int32) & 0xFFFF
    bits = bits.view(nt, 2, 8, gp).permute(0, 3, 2, 1)  # (NT, GP, g, row half)
    sc = (bits[..., 0] | (bits[..., 1] << 16)).contiguous()  # int32: the shift wraps into the sign bit
    return MmaWeights(wq, sc, n, k, group_size)


def shape_only(n: int, k: int, group_size: int) -> MmaWeights:
    """An (N, K) layer's layout with no data (``meta`` tensors of the right shapes), for what reads only its
    tile counts: configs, heuristics, the SASS guard."""
    nt, ks = tiles(n, k)
    gp = 1 if group_size == fmt.PER_ROW else -(-(ks * K_STEP) // fmt.group_width(group_size, ks * K_STEP))
    return MmaWeights(torch.empty(nt, ks, 32, 4, dtype=torch.int32, device="meta"),
                      torch.empty(nt, gp, 8, dtype=torch.int32, device="meta"), n, k, group_size)


def layout_codes(r: MmaWeights) -> torch.Tensor:
    """The codes ``c = w + 1`` (NT 16, KS 128) int64 as the layout holds them, padding included."""
    nt, ks = r.row_tiles, r.k_steps
    w = r.wq.to(torch.int64) & 0xFFFFFFFF  # (NT, KS, 32, 4)
    shift = 2 * torch.arange(8, device=w.device)
    lo = (w[..., None] >> shift) & 3
    hi = (w[..., None] >> (shift + 16)) & 3  # (NT, KS, 32, 4, 8)
    codes = torch.empty(nt, ks, ROW_TILE, K_STEP, dtype=torch.int64, device=w.device)
    rows, cols = _index_tables(w.device)
    codes[:, :, rows, cols] = lo
    codes[:, :, rows, cols + 1] = hi
    return codes.permute(0, 2, 1, 3).reshape(nt * ROW_TILE, ks * K_STEP)


def k32_a_fragment() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where a layout word's codes sit in an int8 ``k32`` A fragment (``mma.sync`` m16n8k32, and wgmma's register
    A): for lane (g, t), register q (``(w >> 2q) & 0x03030303``) and byte b, the row ``g + 8 (q % 2)`` and the
    position ``4t + b + 16 (q // 2)`` (each (32, 4, 4)), and the word's bit ``2q + 8b`` (4, 4) that starts the
    code."""
    lane = torch.arange(32)
    g, t = lane >> 2, lane & 3
    q, b = torch.arange(4)[:, None], torch.arange(4)[None, :]
    rows = (g[:, None, None] + 8 * (q & 1)).expand(32, 4, 4)
    positions = (4 * t[:, None, None] + b + 16 * (q >> 1)).expand(32, 4, 4)
    return rows, positions, (2 * q + 8 * b).expand(4, 4)


def layout_scales(r: MmaWeights) -> torch.Tensor:
    """The scales (NT 16, GP) float32 as the layout holds them (bf16 values), padding included."""
    sw = r.sc.to(torch.int64) & 0xFFFFFFFF  # (NT, GP, 8)
    halves = torch.stack([sw & 0xFFFF, sw >> 16], dim=-1)  # (NT, GP, g, half)
    s16 = halves.permute(0, 3, 2, 1).reshape(r.row_tiles * ROW_TILE, -1).to(torch.int16)  # wraps like the bits do
    return s16.view(torch.bfloat16).float()


def unpack_layout(r: MmaWeights) -> torch.Tensor:
    """The dense float32 weight (N, K) that the kernel computes with, decoded from the layout as it does."""
    values = (layout_codes(r) - 1).float()
    s = layout_scales(r)
    if r.group_size == fmt.PER_ROW:
        w_full = values * s[:, :1]
    else:
        width = r.group_size
        w_full = (values.view(values.shape[0], -1, width) * s[:, : values.shape[1] // width, None]).view(values.shape)
    return w_full[: r.n, : r.k]


@dataclass(frozen=True)
class MmaConfig:
    """``rt`` row tiles of 16 a warp, ``ki`` 128-input steps a chunk, ``splits`` of K,
    ``stages`` of the shared-memory ring, ``fold``: scale and offset per group in fp32 (see ``mma.cu``),
    ``warps`` a block, ``mt`` token tiles of 8 a block (0: the fewest that hold M, at most 8; a block
    takes a slice of ``8 mt`` tokens and the grid covers M with slices)."""

    rt: int = 2
    ki: int = 2
    splits: int = 1
    stages: int = 4
    fold: bool = True
    warps: int = 4
    mt: int = 0


def token_tiles(m: int, mt: int = 0) -> int:
    """Token tiles of 8 a block for M rows: ``mt`` if given, else the fewest that hold M (at most 8)."""
    if mt:
        if mt not in TOKEN_TILES:
            raise ValueError(f"the mma kernel takes {TOKEN_TILES} token tiles a block, not {mt}")
        return mt
    return next((t for t in TOKEN_TILES if m <= 8 * t), TOKEN_TILES[-1])


def token_slices(m: int, mt: int) -> int:
    """Slices of ``8 mt`` tokens that cover M rows (the grid's third dimension)."""
    return max(1, -(-m // (8 * mt)))


def smem_bytes(mt: int, cfg: MmaConfig, group_size: int) -> int:
    """Dynamic shared memory of a launch: ``stages`` x (activations + codes + scales of a chunk)."""
    x = mt * 8 * (cfg.ki * K_STEP + 8) * 2
    w = cfg.warps * cfg.rt * cfg.ki * 512
    s = 0 if group_size == fmt.PER_ROW else cfg.warps * cfg.rt * (cfg.ki * K_STEP // group_size) * 32
    return cfg.stages * (x + w + s)


@cache
def max_smem(device: torch.device) -> int:
    """Dynamic shared memory a block may opt in to on ``device`` (99 KiB on sm_86/89, 163 KiB on sm_80, ...)."""
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 99 * 1024)


def fit_shared_memory(mt: int, cfg: MmaConfig, group_size: int, limit: int) -> MmaConfig:
    """``cfg``, or the nearest config whose shared memory fits ``limit``: fewer stages (down to 2), then fewer
    128-input steps a chunk, row tiles a warp, warps. The shipped tables were tuned on an H200 (227 KiB a
    block); a smaller GPU runs their configs cut down to fit instead of failing to launch."""
    while smem_bytes(mt, cfg, group_size) > limit:
        if cfg.stages > 2:
            cfg = replace(cfg, stages=cfg.stages - 1)
        elif cfg.ki > 1:
            cfg = replace(cfg, ki=cfg.ki // 2)
        elif cfg.rt > 1:
            cfg = replace(cfg, rt=cfg.rt // 2)
        elif cfg.warps > WARPS:
            cfg = replace(cfg, warps=WARPS)
        else:
            break  # the smallest config (under 40 KiB at 8 token tiles): every CUDA GPU of sm_80 and up holds it
    return cfg


def kernel_name(mt: int, cfg: MmaConfig, group_size: int) -> str:
    gs = 0 if group_size == fmt.PER_ROW else group_size
    return f"trit_mma<{mt}, {cfg.rt}, {cfg.ki}, {gs}, {cfg.stages}, {'true' if cfg.fold else 'false'}, {cfg.warps}>"


def heuristic(m: int, row_tiles: int, k_steps: int, sms: int) -> MmaConfig:
    """A config without tuning, after what tuning on the H200 chose (``kernels/tuned/h200.json``).

    Up to 8 rows: two row tiles a warp and the fp32 fold. Above: no fold (its sums would spill registers), two
    row tiles a warp where that still gives every SM a block, else one; eight warps from 33 rows; above 64
    rows, 64 tokens a block. Then K splits until each SM has about four blocks (at most 16; none without
    the fold where the blocks already cover the SMs)."""
    mt = token_tiles(min(m, MAX_M))
    fold = mt == 1
    warps = 8 if mt >= 8 else WARPS
    rt = 2 if fold or grid(row_tiles, k_steps, warps, 2, 1)[0] >= sms else 1
    ki = 2 if m <= 32 else 1
    blocks, chunks = grid(row_tiles, k_steps, warps, rt, ki)
    blocks *= token_slices(m, mt)
    splits = 1 if blocks >= sms and not fold else max(1, min(chunks // 2, 16, math.ceil(4 * sms / blocks)))
    return MmaConfig(rt, ki, splits, 4 if fold else 3, fold, warps, mt if m > MAX_M else 0)


def configs_for(m: int, r: MmaWeights, sms: int) -> list[MmaConfig]:
    """The search space of tuning (``trit bench kernels``, ``benchmarks/exp_mma.py``) for M rows of layer ``r``."""
    out = []
    for mt in (token_tiles(m),) if m <= MAX_M else (4, 8):
        rts = (1, 2, 4)
        kis = (1, 2, 4) if mt <= 2 else (1, 2)
        folds = (True, False) if mt <= 4 and m <= MAX_M else (False,)
        slices = token_slices(m, mt)
        for rt in rts:
            for ki in kis:
                for nw in (4,) if mt <= 2 else (4, 8):
                    blocks, chunks = grid(r.row_tiles, r.k_steps, nw, rt, ki)
                    blocks *= slices
                    for fold in folds:
                        stages = next((st for st in (3, 2) if smem_bytes(mt, MmaConfig(rt, ki, 1, st, fold, nw),
                                                                          r.group_size) <= 200 * 1024), None)
                        if stages is None:
                            continue
                        for sk in (1, 2, 4, 8, 16) if m <= MAX_M else (1, 2, 4):
                            if sk > chunks or (sk > 1 and blocks * sk > 8 * sms):
                                continue
                            out.append(MmaConfig(rt, ki, sk, stages, fold, nw, 0 if m <= MAX_M else mt))
    return out


_WORKSPACE: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}


def workspace(device: torch.device, floats: int, locks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K sums (fp32, zero between calls: the last block of each row block zeroes its rows) and counters.

    A larger request adds a larger buffer; the smaller ones stay allocated, because a CUDA graph captured
    earlier may still write to them.
    """
    idx = device.index if device.index is not None else torch.cuda.current_device()
    kept = _WORKSPACE.setdefault(idx, [])
    if not kept or kept[-1][0].numel() < floats or kept[-1][1].numel() < locks:
        old = (0, 0) if not kept else (kept[-1][0].numel(), kept[-1][1].numel())
        kept.append((torch.zeros(max(floats, old[0]), dtype=torch.float32, device=device),
                     torch.zeros(max(locks, old[1], 1024), dtype=torch.int32, device=device)))
    return kept[-1]


def check_x(x: torch.Tensor, r: MmaWeights, kernel: str) -> None:
    """``x`` as every kernel of the layout takes it: (M, K) bf16, K = ``r.k``, a multiple of 8 (:func:`run` makes
    it contiguous and 16-byte aligned)."""
    _, k = x.shape
    if x.dtype != torch.bfloat16 or k != r.k or k % 8:
        raise ValueError(f"{kernel} takes bf16 x with K = {r.k} (a multiple of 8), got {x.dtype} {tuple(x.shape)}")


def linear(x: torch.Tensor, r: MmaWeights, config: MmaConfig | None = None) -> torch.Tensor:
    """``x`` (M, K) bf16 -> (M, N) bf16 through the CUDA kernel."""
    check_x(x, r, "trit_mma")
    return run(plan(x.shape[0], r, config, x.device), x, r)


def plan(m: int, r: MmaWeights, config: MmaConfig | None, device: torch.device) -> Plan:
    """How the mma kernel runs M rows of a layer shaped like ``r`` (``config``, else the heuristic's)."""
    from trit.kernels.cuda import nvrtc
    from trit.kernels.triton.device import sm_count

    cfg = config or heuristic(m, r.row_tiles, r.k_steps, sm_count())
    mt = token_tiles(m, cfg.mt)
    cfg = fit_shared_memory(mt, cfg, r.group_size, max_smem(device) - 1024)
    smem = smem_bytes(mt, cfg, r.group_size)
    kern = nvrtc.load(source(), kernel_name(mt, cfg, r.group_size), smem=smem)
    return gemm_plan(kern, r, cfg.warps, cfg.rt, cfg.ki, cfg.splits, token_slices(m, mt), smem)


def gemm_plan(kern, r: MmaWeights, warps: int, rt: int, ki: int, splits: int, slices: int, smem: int,
              launch_warps: int | None = None) -> Plan:
    """A GEMM kernel of this layout (``trit_mma``, ``trit_wgmma``: the same arguments): the grid of row blocks x
    K splits x token slices (:func:`launch`), blocks of ``warps`` x ``rt`` row tiles, launched with
    ``launch_warps`` warps a block (``warps`` unless the kernel has warps that own no tiles)."""
    blocks, chunks = grid(r.row_tiles, r.k_steps, warps, rt, ki)
    splits = max(1, min(splits, chunks))
    per_split = -(-chunks // splits)
    return Plan(kern, blocks, per_split, -(-chunks // per_split), slices, launch_warps or warps, smem)


@dataclass(frozen=True)
class Plan:
    """A launch of one of this layout's kernels, worked out once for a problem (kernel, config, grid) and kept by
    :mod:`trit.kernels.cuda.launch`, so that a call repeats only :func:`run`."""

    kern: object  # nvrtc.Kernel
    blocks: int
    per_split: int
    splits: int
    slices: int
    warps: int
    smem: int


def run(p: Plan, x: torch.Tensor, r: MmaWeights) -> torch.Tensor:
    """``x`` (M, K) bf16, K = ``r.k`` -> (M, N) bf16 as planned. Every kernel of the layout copies ``x`` in 16-byte
    pieces from its first byte (``cp.async`` or vector loads), so an ``x`` that does not start on 16 bytes (a view
    into a larger buffer) is copied first."""
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    return launch(p.kern, x, r, p.blocks, p.per_split, p.splits, p.slices, p.warps, p.smem)


# the parameters every kernel of this layout takes (``trit_mma``, ``trit_wgmma``, ``trit_gemv``, ``trit_imma``):
# wq, sc, x, y, ws, locks, then M, N, K, KS, GP, the steps or chunks a split, splits (nvrtc.param_layout's codes)
SIGNATURE = "PPPPPPiiiiiii"


def launch(kern, x: torch.Tensor, r: MmaWeights, blocks: int, per_split: int, splits: int, slices: int, warps: int,
           smem: int) -> torch.Tensor:
    """Launch any kernel of this layout (they all take the same arguments: ``trit_mma``, ``trit_wgmma``,
    ``trit_gemv``, ``trit_imma``) on contiguous bf16 ``x``: a grid of row blocks x K splits (``per_split`` steps
    or chunks each) x token slices, with the split-K workspace and its counters."""
    m, k = x.shape
    y = torch.empty(m, r.n, dtype=torch.bfloat16, device=x.device)
    ws, locks = workspace(x.device, m * r.n if splits > 1 else 0, blocks * slices)
    kern.launch((blocks, splits, slices), warps * 32, smem, SIGNATURE,
                (r.wq.data_ptr(), r.sc.data_ptr(), x.data_ptr(), y.data_ptr(), ws.data_ptr(), locks.data_ptr(),
                 m, r.n, k, r.k_steps, r.scale_groups, per_split, splits))
    return y
