"""W1.58A8 on Hopper's int8 warpgroup MMA (``wgmma_a8.cu``, sm_90a): the mma layout, one scale a row or groups
of 64 or 128.

The activations are rounded per token to int8 as BitNet rounds them, in one
Triton launch (:func:`trit.kernels.triton.quantize.quantize_rows_mma`) that
also writes each 32 inputs in the order of the A fragment's ``k32`` step
(:func:`input_order`) and each token's sum of codes. A word of the layout is
then the A operand of one ``k32`` step as it stands (the codes ``c = w + 1``
as u8, four to a register with a shift and a mask), the tensor cores sum
``c x_q`` exactly in int32 at twice bf16's rate, and the epilogue takes
``(sum c x_q - sum x_q) * scale / s``. With groups of scales the codes go in
as s8 (``c - 1``), each group's int32 sums are scaled into float sums after
its last ``k32`` step, and the epilogue divides by ``s``. :func:`emulate`
replays the kernel's fragments in plain PyTorch, so the CPU tests check the
order and the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import torch

from trit import format as fmt
from trit.kernels.cuda import mma, wgmma
from trit.kernels.cuda.wgmma import TOKENS, WgmmaConfig

SOURCE_FILE = Path(__file__).with_name("wgmma_a8.cu")
MIN_M = 16  # without a tuned choice it takes M from here up (below, the GEMV and mma.sync kernels on x_q / s)
GROUPS_MAX_M = 64  # with groups of scales, without a tuned choice, up to here (above, the bf16 kernels on x_q / s)
SIGNATURE = "PPPPPPPPiiiiiii"  # wq, sc, x, y, ws, locks, xs, xsum, then M, N, K (padded), KS, GP, chunks a split, splits


def _wrapper(n: int) -> str:
    """``wgmma_u8s8<n>``: one m64n{n}k32 MMA, A (u8) from registers, B (s8) from shared memory, D += A B in int32."""
    return wgmma.wrapper("wgmma_u8s8", n, 32, "s32.u8.s8", "int", "r")


def _wrapper_s8(n: int) -> str:
    """``wgmma_s8s8<n>``: one m64n{n}k32 MMA, A (s8) from registers, B (s8) from shared memory, D (+)= A B in int32
    (``accumulate`` 0: the sums start afresh)."""
    return wgmma.wrapper("wgmma_s8s8", n, 32, "s32.s8.s8", "int", "r", accumulate_arg=True)


@lru_cache(maxsize=1)
def source() -> str:
    head = ("template <int N> __device__ __forceinline__ void wgmma_u8s8(int* c, const u32* a, unsigned long long desc);\n"
            "template <int N> __device__ __forceinline__ void wgmma_s8s8(int* c, const u32* a, unsigned long long desc, "
            "int accumulate);\n")
    return (wgmma.source() + "\n" + head + "".join(_wrapper(n) + _wrapper_s8(n) for n in TOKENS) + "\n"
            + SOURCE_FILE.read_text())


def input_order() -> torch.Tensor:
    """(32,): the input of a 32-input word at each position of the ``k32`` A fragment. Position ``4t + b + 16h``
    (lane t, byte b of register 2h or 2h + 1) holds the code in bits ``2q + 8b`` of the word, which the layout
    gave input ``16 (b % 2) + 8 h + 2t + b // 2`` (:mod:`trit.kernels.cuda.mma`)."""
    pos = torch.arange(32)
    t, b, h = (pos % 16) // 4, pos % 4, pos // 16
    return 16 * (b % 2) + 8 * h + 2 * t + b // 2


def quantize_reference(x: torch.Tensor, k_pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What :func:`trit.kernels.triton.quantize.quantize_rows_mma` writes, in plain PyTorch: int8 codes (M,
    ``k_pad``) in :func:`input_order` a word, zero past K; scales ``s`` (M,) f32; sums of codes (M,) int32."""
    from trit.kernels.reference import quantize_activations_int8

    q, s = quantize_activations_int8(x)
    q = torch.nn.functional.pad(q, (0, k_pad - x.shape[-1]))
    q = q.view(q.shape[0], -1, 32)[:, :, input_order().to(q.device)].reshape(q.shape[0], k_pad)
    return q, s.view(-1), q.sum(dim=1, dtype=torch.int32)


def quantize(x: torch.Tensor, k_pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (M, K) -> the kernel's x, scales and sums: one Triton launch on CUDA, the reference elsewhere."""
    if x.is_cuda:
        from trit.kernels.triton.quantize import quantize_rows_mma

        return quantize_rows_mma(x, k_pad)
    return quantize_reference(x, k_pad)


def decode_s8(v: torch.Tensor) -> torch.Tensor:
    """``wgmma_a8.cu``'s s8 register from ``v = w >> 2q`` (int64 holding 32 bits): byte b is ``c - 1`` for the code
    ``c`` in bits ``8b``, ``8b + 1`` (0xFF, 0, 1): bit 0 is the code's low bit inverted, bits 1 to 7 are set where
    both code bits are clear."""
    zero = ~v & ~(v >> 1) & 0x01010101
    return ((zero * 0xFE) | (~v & 0x01010101)) & 0xFFFFFFFF


def emulate(x: torch.Tensor, r: mma.MmaWeights) -> torch.Tensor:
    """(M, N) float32: the kernel's output before its bf16 rounding, by replaying it: the A registers decoded from
    the layout's words (register q: bytes ``(w >> 2q) & 3``, row ``g + 8 (q % 2)``, fragment position ``4t + b +
    16 (q // 2)``), the B operand read from :func:`quantize_reference`'s codes at those positions, int32 sums,
    then the epilogue's correction and scales. Groups of scales: the registers as the kernel decodes them to s8
    (:func:`decode_s8`), a group's int32 sums times its scale added up in float32, then ``/ s``."""
    q, s, sums = quantize_reference(x.float().cpu(), r.k_steps * mma.K_STEP)
    m = q.shape[0]
    rows, pos, bits = mma.k32_a_fragment()
    words = r.wq.cpu().long() & 0xFFFFFFFF  # (NT, KS, 32 lanes, 4 words)
    grouped = r.group_size != fmt.PER_ROW
    a = torch.zeros(r.row_tiles, r.k_steps, 4, 16, 32, dtype=torch.long)  # (tile, step, word, row, position)
    for j in range(4):
        if grouped:  # the kernel's s8 registers, then their bytes as signed
            reg_shift = bits % 8  # 2q: register q; the rest of the bit, 8b, is byte b
            v = (decode_s8(words[..., j, None, None] >> reg_shift) >> (bits - reg_shift)) & 0xFF
            a[:, :, j][:, :, rows, pos] = torch.where(v >= 128, v - 256, v)
        else:
            a[:, :, j][:, :, rows, pos] = (words[..., j, None, None] >> bits) & 3
    b = q.long().view(m, r.k_steps, 4, 32)  # (token, step, word, position)
    scale = mma.layout_scales(r)  # (NT 16, GP)
    if not grouped:
        acc = torch.einsum("tsjrp,msjp->mtr", a, b).reshape(m, -1)[:, : r.n]  # exact in int64
        return (acc - sums[:, None].long()).float() * scale[: r.n, 0] / s[:, None]
    steps = r.group_size // 32  # k32 steps a group
    a = a.view(r.row_tiles, -1, 16, 32)  # (tile, k32 step, row, position): the s8 codes
    b = b.reshape(m, -1, 32)  # (token, k32 step, position)
    groups = a.shape[1] // steps
    acc = torch.einsum("tgkrp,mgkp->mgtr", a.view(r.row_tiles, groups, steps, 16, 32),
                       b.view(m, groups, steps, 32)).reshape(m, groups, -1)  # (token, group, row) exact
    live = min(groups, scale.shape[1])  # groups past K (the last 128-step's padding) hold zeros
    y = (acc[:, :live].float() * scale[:, :live].T[None]).sum(1)
    return y[:, : r.n] / s[:, None]


def _gs(group_size: int) -> int:
    """The kernel's GS: inputs a scale, 0 for one scale a row."""
    return 0 if group_size == fmt.PER_ROW else group_size


def valid(cfg: WgmmaConfig, group_size: int = fmt.PER_ROW) -> bool:
    """``wgmma_a8.cu``'s static asserts and register budget: whole warpgroups, 3 stages or more, at most 4
    128-input steps a chunk, ``rt * ntok <= 256`` (128 with groups, whose float sums double the accumulators), 2
    or 4 A-register buffers that cycle over a chunk's k32 steps, and copy passes of whole 8-token groups (16 bytes
    a thread, 128 ``ki`` bytes a token) that cover the tokens; no warp-specialized variant."""
    accumulators = 256 if _gs(group_size) == 0 else 128
    if cfg.ntok not in TOKENS or cfg.warps % 4 or cfg.stages < 3 or cfg.rt * cfg.ntok > accumulators \
            or cfg.ki > 4 or cfg.bufs not in (2, 4) or (4 * cfg.ki) % cfg.bufs or cfg.ws:
        return False
    threads, pieces = cfg.warps * 32, cfg.ki * 8
    if threads % pieces:
        return False
    rows_a_pass = threads // pieces
    return rows_a_pass % 8 == 0 and cfg.ntok % rows_a_pass == 0 and cfg.ntok // rows_a_pass <= 32


def smem_bytes(cfg: WgmmaConfig, group_size: int = fmt.PER_ROW) -> int:
    gs = _gs(group_size)
    scales = 0 if gs == 0 else cfg.warps * cfg.rt * (cfg.ki * mma.K_STEP // gs) * 32
    stage = cfg.ntok * cfg.ki * mma.K_STEP + cfg.warps * cfg.rt * cfg.ki * 512 + scales
    return cfg.stages * (-(-stage // 1024) * 1024) + 1024  # stages on 1024-byte boundaries


def kernel_name(cfg: WgmmaConfig, group_size: int = fmt.PER_ROW) -> str:
    return (f"trit_wgmma_a8<{cfg.ntok}, {cfg.rt}, {cfg.ki}, {_gs(group_size)}, {cfg.stages}, {cfg.warps}, "
            f"{cfg.bufs}>")


def _stages(cfg: WgmmaConfig, group_size: int = fmt.PER_ROW) -> int:
    """The most stages (up to 6) that fit :data:`wgmma.SMEM_LIMIT`."""
    return next((st for st in (6, 5, 4, 3)
                 if smem_bytes(replace(cfg, stages=st), group_size) <= wgmma.SMEM_LIMIT), 3)


def configs_for(m: int, r: mma.MmaWeights, sms: int) -> list[WgmmaConfig]:
    """The search space of tuning for M rows of layer ``r``: the token widths :mod:`.wgmma` tries, one or two
    row tiles a warp, four or eight warps, one or two steps a chunk, K split up to 4 where the blocks are few."""
    out = []
    for ntok in wgmma._token_widths(m):
        for rt in (1, 2):
            for warps, ki in ((4, 1), (8, 1), (8, 2), (4, 2)):
                for bufs in (2, 4):
                    cfg = WgmmaConfig(ntok, rt, ki, 1, 3, warps, bufs)
                    if not valid(cfg, r.group_size):
                        continue
                    blocks, chunks = mma.grid(r.row_tiles, r.k_steps, warps, rt, ki)
                    blocks *= -(-m // ntok)
                    out += [replace(cfg, splits=sk, stages=_stages(cfg, r.group_size)) for sk in (1, 2, 4)
                            if sk == 1 or (sk <= chunks // 2 and blocks * sk <= 4 * sms)]
    return out


def heuristic(m: int, r: mma.MmaWeights, sms: int) -> WgmmaConfig:
    """A config without tuning, after what tuning on the H100 chose (``benchmarks/results/wgmma_a8_tune_*``): the
    fewest tokens a block that hold M up to 64 rows, else 128; two 128-input steps a chunk; the big tile (eight
    warps of two row tiles) where it still gives three SMs in four a block, else eight warps of one row tile up
    to 64 tokens and four above (16 tokens: four warps, two row tiles where every SM still gets a block); K split
    in four only for M <= 64 on layers whose K is longer than N; four A-register buffers; as many stages as fit.
    Groups keep ``rt * ntok <= 128`` for their float sums."""
    ntok = wgmma.heuristic_tokens(m)
    slices = -(-m // ntok)

    def blocks(warps: int, rt: int) -> int:
        return mma.grid(r.row_tiles, r.k_steps, warps, rt, 2)[0] * slices

    if ntok == 16:
        warps, rt = 4, 2 if blocks(4, 2) >= sms else 1
    elif 4 * blocks(8, 2) >= 3 * sms:
        warps, rt = 8, 2
    else:
        warps, rt = (8 if ntok <= 64 else 4), 1
    if _gs(r.group_size) and rt * ntok > 128:  # groups: fewer row tiles, for the float sums' registers
        rt = max(1, 128 // ntok)
    chunks = mma.grid(r.row_tiles, r.k_steps, warps, rt, 2)[1]
    splits = 4 if m <= 64 and r.k > r.n and chunks >= 8 else 1
    cfg = WgmmaConfig(ntok, rt, 2, splits, 3, warps, 4)
    return replace(cfg, stages=_stages(cfg, r.group_size))


GROUPS = (fmt.PER_ROW, 64, 128)  # the scale groups it takes: one scale a row, groups of 64 or 128


def group_refusal(group_size: int) -> str | None:
    """Why the kernel cannot run a layer of ``group_size`` on any device (``None``: it can)."""
    if group_size not in GROUPS:
        return f"groups of {group_size}: the int8 wgmma kernel takes one scale a row or groups of 64 or 128"
    return None


def supported(device: torch.device, group_size: int) -> str | None:
    """Why the kernel cannot run a layer with ``group_size`` on ``device`` (``None``: it can)."""
    return group_refusal(group_size) or wgmma.supported(device)


def plan(m: int, r: mma.MmaWeights, config: WgmmaConfig | None, device: torch.device) -> mma.Plan:
    """How the kernel runs M rows of a layer shaped like ``r`` (``config``, else the heuristic's)."""
    from trit.kernels.cuda import nvrtc
    from trit.kernels.triton.device import sm_count

    cfg = config or heuristic(m, r, sm_count())
    if not valid(cfg, r.group_size):
        raise ValueError(f"not a wgmma_a8 config: {cfg}")
    smem = smem_bytes(cfg, r.group_size)
    kern = nvrtc.load(source(), kernel_name(cfg, r.group_size), (), smem=smem, arch_suffix="a")
    return mma.gemm_plan(kern, r, cfg.warps, cfg.rt, cfg.ki, cfg.splits, max(1, math.ceil(m / cfg.ntok)), smem)


def run(p: mma.Plan, x: torch.Tensor, r: mma.MmaWeights) -> torch.Tensor:
    """``x`` (M, K) bf16/fp16/fp32 -> (M, N) bf16 as planned: the rounding launch, then the kernel."""
    kp = r.k_steps * mma.K_STEP
    q, s, sums = quantize(x, kp)
    m = x.shape[0]
    y = torch.empty(m, r.n, dtype=torch.bfloat16, device=x.device)
    ws, locks = mma.workspace(x.device, m * r.n if p.splits > 1 else 0, p.blocks * p.slices)
    p.kern.launch((p.blocks, p.splits, p.slices), p.warps * 32, p.smem, SIGNATURE,
                  (r.wq.data_ptr(), r.sc.data_ptr(), q.data_ptr(), y.data_ptr(), ws.data_ptr(), locks.data_ptr(),
                   s.data_ptr(), sums.data_ptr(), m, r.n, kp, r.k_steps, r.scale_groups, p.per_split, p.splits))
    return y


def linear(x: torch.Tensor, r: mma.MmaWeights, config: WgmmaConfig | None = None) -> torch.Tensor:
    """``x`` (M, K) -> W1.58A8 (M, N) bf16 through the int8 wgmma kernel (sm_90, one scale a row)."""
    if x.dim() != 2 or x.shape[1] != r.k:
        raise ValueError(f"trit_wgmma_a8 takes x of (M, {r.k}), got {tuple(x.shape)}")
    why = supported(x.device, r.group_size)
    if why is not None:
        raise ValueError(f"trit_wgmma_a8: {why}")
    return run(plan(x.shape[0], r, config, x.device), x, r)
