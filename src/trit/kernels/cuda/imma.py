"""The few-token GEMM on int8 tensor cores (``imma.cu``), beside :mod:`.gemv` on the same layout.

It computes what the GEMV computes (the activations rounded per 128-input step
to 15-bit integers, :func:`trit.kernels.cuda.gemv.quantize_activations`; exact
integer sums of codes times those integers a scale group; so
:func:`trit.kernels.cuda.gemv.emulate` is its arithmetic too), but on
``mma.sync m16n8k32`` with the codes as the u8 A operand and the integers split
into a high (s8) and a low (u8) byte, two MMAs: up to eight tokens take the
same MMAs and weight loads (only the rounding grows with M), where the GEMV's
``dp2a`` work grows with each token.

A word of the layout decodes into the four A registers with a shift and a
mask each; the MMA's reduction runs over a permutation of the word's inputs,
which the rounded activations are written in (:func:`record_offsets`).
:func:`emulate_fragments` replays the kernel's fragments and records in plain
PyTorch, so the CPU tests check that permutation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch

from trit import format as fmt
from trit.kernels.cuda import gemv, mma

SOURCE_FILE = Path(__file__).with_name("imma.cu")
TOKEN_TILES = (1, 2, 4)  # tiles of 8 tokens a block
MAX_M = 8 * TOKEN_TILES[-1]


@lru_cache(maxsize=1)
def source() -> str:
    return SOURCE_FILE.with_name("common.cuh").read_text() + "\n" + SOURCE_FILE.read_text()


@dataclass(frozen=True)
class ImmaConfig:
    """``rt`` row tiles of 16 a warp, ``splits`` of K, ``warps`` a block, ``stages`` of codes in the cp.async ring."""

    rt: int = 2
    splits: int = 1
    warps: int = 4
    stages: int = 4


def token_tiles(m: int) -> int:
    for tt in TOKEN_TILES:
        if m <= 8 * tt:
            return tt
    raise ValueError(f"the int8 tensor-core GEMV takes M <= {MAX_M}, not {m}")


def record_bytes(tt: int, group_size: int) -> int:
    """A 128-input step's rounded activations: hi and lo bytes of 8 ``tt`` tokens, their ``inv`` and unit sums."""
    mg = 8 * tt
    return -(-(256 * mg + 4 * mg + 4 * gemv.units(group_size) * mg) // 16) * 16


def smem_bytes(tt: int, cfg: ImmaConfig, steps: int, group_size: int) -> int:
    """``steps`` records, then the ring: ``stages`` x row tiles x (16 bytes of codes + a scale word a unit) a lane."""
    scales = 0 if group_size == fmt.PER_ROW else gemv.units(group_size)
    return steps * record_bytes(tt, group_size) + cfg.stages * cfg.rt * cfg.warps * 32 * (16 + 4 * scales)


def kernel_name(tt: int, cfg: ImmaConfig, group_size: int) -> str:
    gs = 0 if group_size == fmt.PER_ROW else group_size
    return f"trit_imma<{tt}, {cfg.rt}, {gs}, {cfg.warps}, {cfg.stages}>"


def heuristic(m: int, row_tiles: int, k_steps: int, sms: int) -> ImmaConfig:
    """The GEMV's shape of grid (two row tiles a warp where that still fills the SMs, K splits to about four
    blocks an SM), four warps and four stages (the defaults; tuning chose four stages on every problem on the
    H200)."""
    g = gemv.heuristic(min(m, gemv.MAX_M), row_tiles, k_steps, sms)
    return ImmaConfig(g.rt, g.splits)


def fit_shared_memory(tt: int, cfg: ImmaConfig, group_size: int, limit: int) -> ImmaConfig:
    """``cfg``, or the nearest config whose ring and one step's record fit ``limit`` bytes: fewer stages (down to
    2), then four warps, then one row tile (a table or cache tuned on a GPU with more shared memory still runs;
    more steps a split than fit are split further by the launch)."""
    while smem_bytes(tt, cfg, 1, group_size) > limit:
        if cfg.stages > 2:
            cfg = replace(cfg, stages=cfg.stages - 1)
        elif cfg.warps > 4:
            cfg = replace(cfg, warps=4)
        elif cfg.rt > 1:
            cfg = replace(cfg, rt=1)
        else:
            break  # 2 stages, 4 warps, 1 row tile: under 20 KiB at 4 token tiles
    return cfg


def configs_for(r: mma.MmaWeights, sms: int) -> list[ImmaConfig]:
    """The search space of tuning (``trit bench kernels``) for layer ``r``."""
    out = []
    for rt in (1, 2):
        for warps in (4, 8):
            for stages in (4, 8):
                out += [ImmaConfig(rt, splits, warps, stages) for splits in gemv.split_choices(r, warps * rt, sms)]
    return out


def linear(x: torch.Tensor, r: mma.MmaWeights, config: ImmaConfig | None = None) -> torch.Tensor:
    """``x`` (M, K) bf16, M <= :data:`MAX_M` -> (M, N) bf16 through the int8 tensor-core kernel."""
    mma.check_x(x, r, "trit_imma")
    return mma.run(plan(x.shape[0], r, config, x.device), x, r)


def plan(m: int, r: mma.MmaWeights, config: ImmaConfig | None, device: torch.device) -> mma.Plan:
    """How the int8 GEMV runs M rows of a layer shaped like ``r`` (``config``, else the heuristic's)."""
    from trit.kernels.triton.device import sm_count

    tt = token_tiles(m)
    cfg = config or heuristic(m, r.row_tiles, r.k_steps, sm_count())
    cfg = fit_shared_memory(tt, cfg, r.group_size, min(gemv.MAX_SMEM, mma.max_smem(device) - 1024))
    return gemv.few_token_plan(source(), kernel_name(tt, cfg, r.group_size),
                               lambda per: smem_bytes(tt, cfg, per, r.group_size), r, device, cfg.splits,
                               cfg.warps * cfg.rt, cfg.warps)


def record_offsets(tt: int) -> torch.Tensor:
    """(4, 8 tt, 32): the byte offset, in a step's record, of each token's hi byte of each of a word's 32 inputs
    (its lo byte is 8 further), as the kernel writes them."""
    mg = 8 * tt
    c32 = torch.arange(32)
    rem = c32 & 15
    b, tq, h = (c32 >> 4) | ((rem & 1) << 1), (rem >> 1) & 3, rem >> 3
    j = torch.arange(4)[:, None, None]
    m = torch.arange(mg)[None, :, None]
    return ((j * mg + m) * 4 + tq) * 16 + h * 4 + b


def emulate_fragments(x: torch.Tensor, r: mma.MmaWeights) -> torch.Tensor:
    """The kernel's integer sums (M, N, K / 32), one a row, token and word of 32 inputs, by replaying it: A
    registers decoded from the layout's words, B registers read from the records at :func:`record_offsets`, each
    ``m16n8k32`` as the PTX manual defines its fragments, hi and lo MMAs joined as ``256 hi + lo``."""
    m = x.shape[0]
    tt = token_tiles(m)
    mg = 8 * tt
    xi, _ = gemv.quantize_activations(x.float().cpu(), r.k_steps)  # (M, Kp) exact integers
    xi = xi.long()
    rec = torch.zeros(r.k_steps, 256 * mg, dtype=torch.long)  # the first 256 mg bytes of each step's record
    off = record_offsets(tt)  # (4, mg, 32)
    steps = xi.view(m, r.k_steps, 4, 32)
    for tok in range(m):
        rec[:, off[:, tok].reshape(-1)] = ((steps[tok] >> 8) & 0xFF).reshape(r.k_steps, -1)  # hi, a byte
        rec[:, off[:, tok].reshape(-1) + 8] = (steps[tok] & 0xFF).reshape(r.k_steps, -1)  # lo
    # A[row, kappa] from lane (g, t), register q, byte b; B[kappa, col] from lane (g', t'), register h, byte b
    a_row, a_kap, a_bit = mma.k32_a_fragment()
    words = r.wq.cpu().long() & 0xFFFFFFFF  # (NT, KS, 32 lanes, 4 words)
    out = torch.zeros(m, r.row_tiles * 16, r.k_steps * 4, dtype=torch.long)
    for j in range(4):
        w = words[..., j]  # (NT, KS, 32)
        codes = (w[..., None, None] >> a_bit) & 3  # (NT, KS, 32, 4, 4)
        A = torch.zeros(r.row_tiles, r.k_steps, 16, 32, dtype=torch.long)
        A[:, :, a_row, a_kap] = codes
        for half, shift in ((0, 0), (8, 1)):  # hi, then lo
            B = torch.zeros(r.k_steps, 32, mg, dtype=torch.long)
            for gg in range(mg):
                for tq in range(4):
                    for h in range(2):
                        base = ((j * mg + gg) * 4 + tq) * 16 + half + h * 4
                        B[:, 4 * tq + 16 * h + torch.arange(4), gg] = rec[:, base: base + 4]
            if not shift:
                B = torch.where(B >= 128, B - 256, B)  # the hi byte is read as s8
            part = torch.einsum("tsrk,skc->ctrs", A, B).reshape(mg, -1, r.k_steps)
            out[:, :, j::4] += part[:m] * (1 if shift else 256)
    return out[:, : r.n]
