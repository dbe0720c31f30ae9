"""The mma layout's product on Hopper's warpgroup MMA (``wgmma.cu``, sm_90a): 16 to 256 tokens a block.

Same layout as :mod:`trit.kernels.cuda.mma` (nothing is repacked again): each warp
decodes the A fragments of its 16-row tiles into registers, and the tokens are
the wgmma's N, read from shared memory in the 128-byte swizzle. It runs on sm_90
only (``wgmma`` needs the ``sm_90a`` target); elsewhere the mma.sync kernel and
dequantize + cuBLAS keep these sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch

from trit import format as fmt
from trit.kernels.cuda import mma

SOURCE_FILE = Path(__file__).with_name("wgmma.cu")
TOKENS = (16, 32, 64, 128, 256)  # the wgmma widths a block can take (N of m64nNk16)
MIN_M, MAX_M = 64, 256  # without a tuned choice, it takes these M on sm_90 (the tuned tables say where else)
# `trit bench kernels` times it from TUNE_MIN_M to TUNE_MAX_M rows (docs/kernels.md, "Where the defaults come from")
TUNE_MIN_M, TUNE_MAX_M = 16, 512
SMEM_LIMIT = 220 * 1024  # dynamic shared memory a config may take (sm_90 opts in to 227 KiB a block)
SM_SMEM = 228 * 1024  # shared memory of an SM (sm_90), of which each resident block also takes 1 KiB
ARCH = (9, 0)  # wgmma.mma_async: sm_90a only (Blackwell has tcgen05 instead)


def wrapper(name: str, n: int, k: int, types: str, acc: str, cons: str, tail: str = "",
            accumulate_arg: bool = False) -> str:
    """``name<n>``: one m64n{n}k{k} wgmma of ``types`` (D.A.B), A from registers, B from shared memory through a
    descriptor, D += A B into ``acc`` accumulators (PTX constraint ``cons``); ``tail``: the immediates after the
    scale-d predicate (bf16's scales and transpose). With ``accumulate_arg`` the function takes ``int accumulate``
    (0: D = A B, the sums start afresh), else it always accumulates."""
    d = n // 2
    outs = ", ".join(f"%{i}" for i in range(d))
    body = (f"{{ .reg .pred p; setp.ne.b32 p, %{d + 5}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{types} {{{outs}}}, "
            f"{{%{d}, %{d + 1}, %{d + 2}, %{d + 3}}}, %{d + 4}, p{tail}; }}")
    outs_c = ", ".join(f'"+{cons}"(c[{i}])' for i in range(d))
    arg, value = (", int accumulate", "accumulate") if accumulate_arg else ("", "1")
    return (f"template <> __device__ __forceinline__ void {name}<{n}>({acc}* c, const u32* a, "
            f"unsigned long long desc{arg}) {{\n"
            f'    asm volatile("{body}" : {outs_c} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), '
            f'"r"({value}));\n}}\n')


def _wrapper(n: int) -> str:
    """``wgmma_bf16<n>``: one m64n{n}k16 MMA, A (bf16) from registers, B from shared memory, D += A B in fp32."""
    return wrapper("wgmma_bf16", n, 16, "f32.bf16.bf16", "float", "f", ", 1, 1, 0")


@lru_cache(maxsize=1)
def source() -> str:
    head = "template <int N> __device__ __forceinline__ void wgmma_bf16(float* c, const u32* a, unsigned long long desc);\n"
    return mma.source() + "\n" + head + "".join(_wrapper(n) for n in TOKENS) + "\n" + SOURCE_FILE.read_text()


@dataclass(frozen=True)
class WgmmaConfig:
    """``ntok`` tokens a block, ``rt`` row tiles of 16 a warp, ``ki`` 128-input steps a chunk, ``splits`` of K,
    ``stages`` of the shared-memory ring, ``warps`` a block (a multiple of 4 ``ki``), ``bufs`` A-register
    buffers (2 or 4: the wgmma groups in flight behind the decode). ``ws`` 1: the warp-specialized kernel
    (``trit_wgmma_ws``): ``warps`` (4 or 8) decode and multiply, and a producer warpgroup beside them copies."""

    ntok: int = 128
    rt: int = 1
    ki: int = 1
    splits: int = 1
    stages: int = 3
    warps: int = 8
    bufs: int = 2
    ws: int = 0


def block_warps(cfg: WgmmaConfig) -> int:
    """Warps a block is launched with: ``warps``, and the producer warpgroup of ``trit_wgmma_ws``."""
    return cfg.warps + 4 * cfg.ws


def copy_threads(cfg: WgmmaConfig) -> int:
    """Threads that copy a chunk's activations: every thread of ``trit_wgmma``, the producer's 128 of
    ``trit_wgmma_ws``."""
    return 128 if cfg.ws else cfg.warps * 32


def x_stage_offsets(cfg: WgmmaConfig) -> torch.Tensor:
    """Where ``wgmma.cu``'s copy puts a chunk's activations in a stage: the byte offset of (token, input), an
    (ntok, 128 ki) int64 tensor, from the kernel's own index arithmetic (thread T copies the 16-byte piece
    ``T % (KC / 8)`` of tokens ``T / (KC / 8) + p RPP``, at piece ``(kc % 8) ^ (token % 8)`` of its atom row).
    The CPU tests hold it to the 128-byte swizzle that the descriptors ask the tensor cores to read."""
    kc_total = cfg.ki * mma.K_STEP
    threads, pieces = copy_threads(cfg), kc_total // 8
    rows_a_pass = threads // pieces
    off = torch.full((cfg.ntok, kc_total), -1, dtype=torch.int64)
    for tid in range(threads):
        kc, n0 = tid % pieces, tid // pieces
        for p in range(cfg.ntok // rows_a_pass):
            row = n0 + p * rows_a_pass
            x_off = (kc // 8) * cfg.ntok * 128 + row * 128 + ((kc % 8) ^ (row & 7)) * 16
            off[row, kc * 8: kc * 8 + 8] = x_off + 2 * torch.arange(8)
    return off


def smem_bytes(cfg: WgmmaConfig, group_size: int) -> int:
    x = cfg.ntok * cfg.ki * mma.K_STEP * 2
    w = cfg.warps * cfg.rt * cfg.ki * 512
    s = 0 if group_size == fmt.PER_ROW else cfg.warps * cfg.rt * (cfg.ki * mma.K_STEP // group_size) * 32
    return cfg.stages * (-(-(x + w + s) // 1024) * 1024) + 1024  # stages on 1024-byte boundaries


def kernel_name(cfg: WgmmaConfig, group_size: int) -> str:
    gs = 0 if group_size == fmt.PER_ROW else group_size
    return f"trit_wgmma{'_ws' if cfg.ws else ''}<{cfg.ntok}, {cfg.rt}, {cfg.ki}, {gs}, {cfg.stages}, {cfg.warps}, {cfg.bufs}>"


def valid(cfg: WgmmaConfig) -> bool:
    """Whole warpgroups; copy passes of whole 8-token groups that cover the tokens; 3 stages or more; at most 4
    128-input steps a chunk (a warp copies the chunk's scales, 16 groups of 32 at most); accumulators that leave
    registers for the rest (rt * ntok / 2 <= 128); 2 or 4 A-register buffers: ``wgmma.cu``'s static asserts
    and its register budget. The warp-specialized kernel takes one or two consumer warpgroups, and its producer
    computes each copy pass's swizzle, so a pass may hold part of an 8-token group."""
    threads = copy_threads(cfg)
    if cfg.ntok not in TOKENS or cfg.warps % 4 or cfg.stages < 3 or cfg.rt * cfg.ntok > 256 or cfg.ki > 4 \
            or cfg.bufs not in (2, 4) or cfg.ws not in (0, 1) or (cfg.ws and cfg.warps not in (4, 8)):
        return False
    pieces = cfg.ki * mma.K_STEP // 8
    if threads % pieces:
        return False
    rows_a_pass = threads // pieces
    return (cfg.ws or rows_a_pass % 8 == 0) and cfg.ntok % rows_a_pass == 0 and cfg.ntok // rows_a_pass <= 32


def _stages(cfg: WgmmaConfig, group_size: int, limit: int = SMEM_LIMIT) -> int | None:
    """The most stages (up to 6) whose shared memory fits ``limit`` bytes, if 3 fit."""
    return next((st for st in (6, 5, 4, 3) if smem_bytes(replace(cfg, stages=st), group_size) <= limit), None)


def _stage_options(cfg: WgmmaConfig, group_size: int) -> tuple[int, ...]:
    """Stage counts worth timing for ``cfg``: the most that fit (:func:`_stages`), and the most that let two or
    three blocks share an SM, where their accumulators leave registers for that many (``rt * ntok / 2`` a thread
    plus about 48 for the rest, every thread of the block, the producer's too). Fewer stages a block for more
    warps an SM: which wins is the timing's to say. The warp-specialized kernel with two consumer warpgroups
    holds an SM's registers alone (``setmaxnreg`` shares 384 x 168 among its warpgroups), so it takes the most.
    Each block's shared memory also holds its static part (the mbarriers, under 128 bytes) beside the ring."""
    out = []
    threads = block_warps(cfg) * 32
    for blocks in (1, 2, 3):
        if blocks > 1 and (cfg.ws and cfg.warps == 8
                           or cfg.rt * cfg.ntok // 2 + 48 > 65536 // (blocks * threads)):
            break
        st = _stages(cfg, group_size, SMEM_LIMIT if blocks == 1 else SM_SMEM // blocks - 1024 - 128)
        if st is not None and st not in out:
            out.append(st)
    return tuple(out)


def _token_widths(m: int) -> tuple[int, ...]:
    """Tokens a block worth trying for M rows: the fewest that hold M, and for M > 64 the width below it."""
    fit = next((t for t in TOKENS[:-1] if m <= t), 128)
    return (fit,) if m <= 64 else (64, 128) if m <= 128 else (128, 256)


def heuristic_tokens(m: int) -> int:
    """Tokens a block without tuning (this kernel's and the int8 one's): the fewest that hold M up to 64 rows,
    else 128."""
    return _token_widths(min(m, 128))[-1] if m > 64 else _token_widths(m)[0]


def configs_for(m: int, r: mma.MmaWeights, sms: int) -> list[WgmmaConfig]:
    """The search space of tuning (``trit bench kernels``) for M rows of layer ``r``."""
    out = []
    for ntok in _token_widths(m):
        for rt in (1, 2):
            for warps, ki, ws in ((4, 1, 0), (8, 1, 0), (8, 2, 0), (4, 1, 1), (8, 1, 1), (4, 2, 1), (8, 2, 1)):
                cfg = WgmmaConfig(ntok, rt, ki, 1, 3, warps, ws=ws)
                if not valid(cfg):
                    continue
                blocks, chunks = mma.grid(r.row_tiles, r.k_steps, warps, rt, ki)
                blocks *= -(-m // ntok)
                for sk in (1, 2, 4):
                    if sk == 1 or (sk <= chunks // 2 and blocks * sk <= 4 * sms):
                        out += [replace(cfg, splits=sk, stages=st, bufs=b)
                                for st in _stage_options(cfg, r.group_size) for b in (2, 4)]
    return out


def heuristic(m: int, r: mma.MmaWeights, sms: int) -> WgmmaConfig:
    """A config without tuning, after what tuning on the H200 chose: the fewest tokens a block (16, 32, 64) that
    hold M up to 64 rows, else 128;
    eight warps, two row tiles a warp where that still gives every SM a block, one 128-input step a chunk and
    as many stages as fit; K split (up to 4) until there are two blocks an SM, only up to 64 rows and where K is
    longer than N (where the shipped tables' tuning mostly split it)."""
    ntok = heuristic_tokens(m)
    slices = -(-m // ntok)
    rt = 2 if mma.grid(r.row_tiles, r.k_steps, 8, 2, 1)[0] * slices >= sms and ntok <= 128 else 1
    cfg = WgmmaConfig(ntok, rt, 1, 1, 3, 8)
    blocks, chunks = mma.grid(r.row_tiles, r.k_steps, 8, rt, 1)
    blocks *= slices
    few = blocks < sms and m <= 64 and r.k > r.n  # where the shipped tables' tuning split K (docs/kernels.md)
    splits = max(1, min(4, chunks // 2, math.ceil(2 * sms / blocks))) if few else 1
    return replace(cfg, splits=splits, stages=_stages(cfg, r.group_size) or 3)


NVRTC_MIN = (12, 0)  # the first NVRTC with the sm_90a target


def supported(device: torch.device) -> str | None:
    """Why the wgmma kernel cannot run on ``device`` (``None``: it can)."""
    from trit.kernels.cuda import nvrtc

    if device.type != "cuda":
        return f"runs on CUDA, not {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap != ARCH:
        return f"wgmma needs sm_90 (Hopper); this GPU is sm_{cap[0]}{cap[1]}"
    try:
        have = nvrtc.version()
    except nvrtc.CudaUnavailable as e:
        return str(e)
    if have < NVRTC_MIN:
        return f"NVRTC {have[0]}.{have[1]} has no sm_90a target (wgmma needs {NVRTC_MIN[0]}.{NVRTC_MIN[1]} or later)"
    return None


def linear(x: torch.Tensor, r: mma.MmaWeights, config: WgmmaConfig | None = None,
           options: tuple[str, ...] = ()) -> torch.Tensor:
    """``x`` (M, K) bf16 -> (M, N) bf16 through the wgmma kernel (sm_90 only)."""
    mma.check_x(x, r, "trit_wgmma")
    return mma.run(plan(x.shape[0], r, config, x.device, options), x, r)


def plan(m: int, r: mma.MmaWeights, config: WgmmaConfig | None, device: torch.device,
         options: tuple[str, ...] = ()) -> mma.Plan:
    """How the wgmma kernel runs M rows of a layer shaped like ``r`` (``config``, else the heuristic's)."""
    from trit.kernels.cuda import nvrtc
    from trit.kernels.triton.device import sm_count

    cfg = config or heuristic(m, r, sm_count())
    if not valid(cfg):
        raise ValueError(f"not a wgmma config: {cfg}")
    smem = smem_bytes(cfg, r.group_size)
    kern = nvrtc.load(source(), kernel_name(cfg, r.group_size), options, smem=smem, arch_suffix="a")
    return mma.gemm_plan(kern, r, cfg.warps, cfg.rt, cfg.ki, cfg.splits, max(1, -(-m // cfg.ntok)), smem,
                         launch_warps=block_warps(cfg))
