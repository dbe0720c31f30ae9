"""The decode GEMV (M <= 4) and the dequantizer on the mma layout (``gemv.cu``), beside :mod:`.mma`.

The GEMV multiplies in integers on CUDA cores (``dp2a``, four logic ops and eight
``dp2a`` a word of 16 weights): each block first rounds its share of the
activations to 15-bit integers per 128-input step against the step's largest
(``x ~= xi * inv``, ``inv`` a power of two), as :func:`quantize_activations`
does in plain PyTorch. :func:`emulate` is the kernel's arithmetic in plain
PyTorch (float64), so the CPU tests check the rounding and the bookkeeping of
codes ``c = w + 1``, offsets and scales against the reference; the GPU tests
check the kernel itself against both.

:func:`dequantize` writes the dense bf16 weight from the layout, for prefill
(then cuBLAS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from trit import format as fmt
from trit.kernels.cuda import mma

SOURCE_FILE = Path(__file__).with_name("gemv.cu")
MAX_M = 4
MAX_SMEM = 160 * 1024  # a block's quantized activations stay under this and the device's opt-in limit
X_BITS = 15  # activations become integers below 2**15 in magnitude, per 128-input step


@lru_cache(maxsize=1)
def source() -> str:
    return SOURCE_FILE.with_name("common.cuh").read_text() + "\n" + SOURCE_FILE.read_text()


@dataclass(frozen=True)
class GemvConfig:
    """``rt`` row tiles of 16 a warp, ``splits`` of K, ``warps`` a block, ``pf`` steps of codes loaded ahead."""

    rt: int = 2
    splits: int = 1
    warps: int = 4
    pf: int = 4


def token_slots(m: int) -> int:
    for mg in (1, 2, 4):
        if m <= mg:
            return mg
    raise ValueError(f"the mma-layout GEMV takes M <= {MAX_M}, not {m}")


def units(group_size: int) -> int:
    """Fix-ups a 128-input step: one a scale group, or one a step when groups are larger."""
    return 1 if group_size == fmt.PER_ROW else 128 // group_size


def smem_bytes(mg: int, steps: int, group_size: int) -> int:
    """Quantized activations of ``steps`` 128-input steps: int16 pairs, two scales and the unit sums a step,
    each step's record padded to 16 bytes."""
    return steps * (-(-mg * (256 + 8 + 4 * units(group_size)) // 16) * 16)


def kernel_name(mg: int, cfg: GemvConfig, group_size: int) -> str:
    gs = 0 if group_size == fmt.PER_ROW else group_size
    return f"trit_gemv<{mg}, {cfg.rt}, {gs}, {cfg.warps}, {cfg.pf}>"


def heuristic(m: int, row_tiles: int, k_steps: int, sms: int) -> GemvConfig:
    """Two row tiles a warp, and enough K splits for about four blocks an SM (at least two steps a split)."""
    rt = 2 if row_tiles >= 2 * mma.WARPS * sms else 1
    blocks = -(-row_tiles // (mma.WARPS * rt))
    splits = max(1, min(k_steps // 2, math.ceil(4 * sms / blocks)))
    return GemvConfig(rt, splits)


def configs_for(r: mma.MmaWeights, sms: int) -> list[GemvConfig]:
    """The search space of tuning (``trit bench kernels``, ``benchmarks/exp_mma.py``) for layer ``r``."""
    out = []
    for rt in (1, 2, 4):
        for warps, pf in ((4, 2), (4, 4), (4, 8), (8, 4), (2, 4)):
            if rt == 4 and pf > 4:  # spills registers
                continue
            out += [GemvConfig(rt, splits, warps, pf) for splits in split_choices(r, warps * rt, sms)]
    return out


def split_choices(r: mma.MmaWeights, block_tiles: int, sms: int) -> list[int]:
    """The K splits tuning tries for a few-token kernel whose blocks hold ``block_tiles`` row tiles: 1 to 16, no
    more than the steps, and (split) at most 16 blocks an SM."""
    blocks = -(-r.row_tiles // block_tiles)
    return [s for s in (1, 2, 4, 8, 16) if s <= r.k_steps and (s == 1 or blocks * s <= 16 * sms)]


def split_steps(k_steps: int, splits: int) -> tuple[int, int]:
    """(steps a split, splits) with no empty split."""
    per = -(-k_steps // max(1, min(splits, k_steps)))
    return per, -(-k_steps // per)


def few_token_plan(source: str, name: str, smem_for, r: mma.MmaWeights, device: torch.device, splits: int,
                   block_tiles: int, warps: int) -> mma.Plan:
    """A few-token kernel of this layout (``trit_gemv``, ``trit_imma``: the same arguments): row blocks of
    ``block_tiles`` tiles x K splits, each split's rounded activations in shared memory (``smem_for(steps)``; a
    very long K takes more splits, each rounding less)."""
    from trit.kernels.cuda import nvrtc

    per, splits = split_steps(r.k_steps, splits)
    limit = min(MAX_SMEM, mma.max_smem(device) - 1024)
    while smem_for(per) > limit and per > 1:
        per, splits = split_steps(r.k_steps, 2 * splits)
    smem = smem_for(per)
    kern = nvrtc.load(source, name, smem=smem)
    return mma.Plan(kern, -(-r.row_tiles // block_tiles), per, splits, 1, warps, smem)


def linear(x: torch.Tensor, r: mma.MmaWeights, config: GemvConfig | None = None) -> torch.Tensor:
    """``x`` (M, K) bf16, M <= 4 -> (M, N) bf16 through the CUDA GEMV."""
    mma.check_x(x, r, "trit_gemv")
    return mma.run(plan(x.shape[0], r, config, x.device), x, r)


def plan(m: int, r: mma.MmaWeights, config: GemvConfig | None, device: torch.device) -> mma.Plan:
    """How the GEMV runs M rows of a layer shaped like ``r`` (``config``, else the heuristic's)."""
    from trit.kernels.triton.device import sm_count

    mg = token_slots(m)
    cfg = config or heuristic(m, r.row_tiles, r.k_steps, sm_count())
    return few_token_plan(source(), kernel_name(mg, cfg, r.group_size), lambda per: smem_bytes(mg, per, r.group_size),
                          r, device, cfg.splits, cfg.warps * cfg.rt, cfg.warps)


DEQUANT_SIGNATURE = "PPPiiiii"  # trit_dequant's parameters: wq, sc, out, N, K, KS, GP, GS


def dequantize(r: mma.MmaWeights) -> torch.Tensor:
    """The dense bf16 weight (N, K) of a layer in the mma layout, on its GPU (equal to ``unpack_layout``)."""
    from trit.kernels.cuda import nvrtc

    if r.k % 8:
        raise ValueError(f"trit_dequant writes 16-byte chunks: K = {r.k} must be a multiple of 8")
    out = torch.empty(r.n, r.k, dtype=torch.bfloat16, device=r.wq.device)
    kern = nvrtc.load(source(), "trit_dequant")
    warps = r.row_tiles * r.k_steps  # a warp a (tile, step), four a block
    gs = 0 if r.group_size == fmt.PER_ROW else r.group_size
    kern.launch((-(-warps // 4), 1, 1), 128, 0, DEQUANT_SIGNATURE,
                (r.wq.data_ptr(), r.sc.data_ptr(), out.data_ptr(), r.n, r.k, r.k_steps, r.scale_groups, gs))
    return out


def quantize_activations(x: torch.Tensor, k_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (M, K) -> integers ``xi`` (M, 128 k_steps) and power-of-two ``inv`` (M, k_steps), ``x ~= xi * inv``,
    as the kernel rounds them: per 128-input step, ``|xi| < 2**15``, zero past K."""
    m, k = x.shape
    xp = torch.zeros(m, k_steps * mma.K_STEP, dtype=torch.float64, device=x.device)
    xp[:, :k] = x.double()
    steps = xp.view(m, k_steps, mma.K_STEP)
    amax = steps.abs().amax(-1)
    _, e = torch.frexp(amax)  # amax = f 2**e, 0.5 <= f < 1
    e = e.clamp(min=-100)  # as the kernel: a step of tiny values rounds to zero
    inv = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), e - X_BITS), torch.zeros_like(amax))
    up = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), X_BITS - e), torch.zeros_like(amax))
    xi = torch.round(steps * up[..., None])  # round half to even, as cvt.rni does
    return xi.view(m, -1), inv


def emulate(x: torch.Tensor, r: mma.MmaWeights) -> torch.Tensor:
    """The GEMV's arithmetic in plain PyTorch (float64): per unit (a scale group, or a step), the integer sum of
    codes ``c`` times rounded activations, times ``inv``, less the activations' sum, times the row's scale."""
    m = x.shape[0]
    xi, inv = quantize_activations(x, r.k_steps)  # (M, Kp), (M, KS)
    codes = mma.layout_codes(r)[: r.n].double()  # (N, Kp)
    scales = mma.layout_scales(r)[: r.n].double()  # (N, GP)
    per_step = units(r.group_size)
    width = mma.K_STEP // per_step
    nu = r.k_steps * per_step
    xu = xi.view(m, nu, width)
    sums = torch.einsum("mud,nud->mnu", xu, codes.view(r.n, nu, width))  # exact integers
    inv_u = inv.repeat_interleave(per_step, dim=1)  # (M, nu)
    d = sums * inv_u[:, None, :] - (xu.sum(-1) * inv_u)[:, None, :]
    s = scales[:, :1] if r.group_size == fmt.PER_ROW else scales[:, :nu]
    return (d * s[None]).sum(-1)
