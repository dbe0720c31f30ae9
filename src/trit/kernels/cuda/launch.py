"""The CUDA C++ candidates of :func:`trit.kernels.registry.choose_kernel`, on the load-time mma layout.

A layer is held in one layout (:mod:`trit.linear` chooses it at load). Where
:func:`layout_refusal` finds nothing against it, the layer is repacked once
(:func:`trit.kernels.cuda.mma.repack`) and its forward calls
``trit::linear_tiled``; these kernels take it from there. Each has a refusal
(what it cannot run) and a rule of thumb (where it runs without a tuned
choice): the dp2a GEMV for a few rows, the mma.sync GEMM up to 64 rows (on
Hopper, up to 63: the wgmma GEMM takes 64 to 256), dequantize + cuBLAS above;
the int8 tensor-core GEMV only where a tuned table measured it fastest; W1.58A8
layers of one scale a row from 16 rows on Hopper's int8 wgmma (the others get
the activations rounded and back, ``x_q / s``). Where
NVRTC cannot compile (no CUDA build of torch, no ``nvidia-cuda-nvrtc``),
nothing is repacked and the Triton kernels read format v1: the reason is
logged once.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from trit import format as fmt
from trit.kernels import tuning
from trit.kernels.cuda import gemv, imma, mma, wgmma, wgmma_a8

log = logging.getLogger(__name__)

# without a tuned choice, the GEMV takes up to this many rows, the mma kernel up to mma.MAX_M (on Hopper the
# wgmma kernel takes wgmma.MIN_M to wgmma.MAX_M), dequantize + cuBLAS the rest; the int8 GEMV only where tuned
GEMV_MAX_M = 4
TABLE_GROUP = 64  # the group size the shipped tables were tuned at


@functools.cache
def unavailable() -> str | None:
    """Why the CUDA kernels cannot run in this process (``None``: they can)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    from trit.kernels.cuda import nvrtc

    try:
        nvrtc.nvrtc()
        nvrtc.driver()
    except nvrtc.CudaUnavailable as e:
        return str(e)
    return None


def layout_refusal(device: torch.device, dtype: torch.dtype, group_size: int, in_features: int) -> str | None:
    """Why a layer on ``device`` running in ``dtype`` cannot be held in the mma layout for these kernels
    (``None``: it can)."""
    if group_size not in mma.GROUPS:
        return f"group size {group_size}: the mma layout takes {mma.GROUPS}"
    if in_features % 8:
        return f"K = {in_features} is not a multiple of 8"
    if device.type != "cuda":
        return f"the mma layout's kernels run on CUDA, not {device.type}"
    if dtype != torch.bfloat16:
        return f"the mma layout's kernels take bf16 activations, not {str(dtype).removeprefix('torch.')}"
    why = unavailable()
    if why is not None:
        _log_once(why)
    return why


@functools.cache
def _log_once(why: str) -> None:
    log.warning("trit: layers stay in format v1 for the Triton kernels: %s", why)


def _can(p) -> str | None:
    if p.device_type != "cuda":
        return f"runs on CUDA, not {p.device_type}"
    if p.dtype != torch.bfloat16:
        return f"takes bf16 activations, not {str(p.dtype).removeprefix('torch.')}"
    if p.k % 8:
        return f"K = {p.k} is not a multiple of 8"
    return unavailable()


def refuse_gemv(p) -> str | None:
    if p.m > gemv.MAX_M:
        return f"M = {p.m} > {gemv.MAX_M}: the GEMV holds at most {gemv.MAX_M} rows"
    return _can(p)


def rule_gemv(p) -> str | None:
    return None if p.m <= GEMV_MAX_M else f"M = {p.m} > {GEMV_MAX_M}: the mma kernel is faster there"


def refuse_imma(p) -> str | None:
    if p.m > imma.MAX_M:
        return f"M = {p.m} > {imma.MAX_M}: it holds at most {imma.MAX_M} tokens"
    return _can(p)


def rule_imma(p) -> str | None:
    return "it runs where a tuned table measured it fastest, not by rule"


def refuse_mma(p) -> str | None:
    return _can(p)


def rule_mma(p) -> str | None:
    return None if p.m <= mma.MAX_M else f"M = {p.m} > {mma.MAX_M}: dequantize + cuBLAS is faster there"


@functools.cache
def _wgmma_support(device_index: int) -> str | None:
    return wgmma.supported(torch.device("cuda", device_index))


def refuse_wgmma(p) -> str | None:
    return _can(p) or _wgmma_support(torch.cuda.current_device())


def rule_wgmma(p) -> str | None:
    if wgmma.MIN_M <= p.m <= wgmma.MAX_M:
        return None
    return f"M = {p.m}: it takes {wgmma.MIN_M} to {wgmma.MAX_M} rows"


def int8_wgmma_refusal(device: torch.device, group_size: int) -> str | None:
    """Why the int8 wgmma kernel cannot run layers of ``group_size`` on ``device`` (``None``: it can)."""
    if device.type != "cuda":
        return f"runs on CUDA, not {device.type}"
    return unavailable() or wgmma_a8.supported(device, group_size)


def refuse_wgmma_a8(p) -> str | None:
    why = _can(p)
    if why is None and not p.act_int8:
        why = "takes int8 activations (W1.58A8) only"
    return why or wgmma_a8.group_refusal(p.group_size) or _wgmma_support(torch.cuda.current_device())


def rule_wgmma_a8(p) -> str | None:
    if p.m < wgmma_a8.MIN_M:
        return f"M = {p.m} < {wgmma_a8.MIN_M}: the GEMV and mma kernels take it"
    if p.group_size != fmt.PER_ROW and p.m > wgmma_a8.GROUPS_MAX_M:
        return (f"M = {p.m} > {wgmma_a8.GROUPS_MAX_M} with groups of {p.group_size}: the bf16 kernels on x_q / s "
                "are faster there")
    return None


def refuse_dequant(p) -> str | None:
    return _can(p)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _finish(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        y = y + bias
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


def _tuned(name: str, x2: torch.Tensor, r: mma.MmaWeights, config_type):
    """The tuned table's config for this problem (``trit bench kernels --tuned-out``), else the one tuned for groups
    of :data:`TABLE_GROUP` where this layer's scales are as few or fewer (one a row, groups of 128: the same
    loop with fewer scale reads, and shared memory that fits), else ``None``: the heuristic."""
    m, dt = x2.shape[0], x2.dtype
    cfg = tuning.lookup(name, tuning.key(m, r.n, r.k, r.group_size, dt), config_type)
    if cfg is None and (r.group_size == fmt.PER_ROW or r.group_size > TABLE_GROUP):
        cfg = tuning.lookup(name, tuning.key(m, r.n, r.k, TABLE_GROUP, dt), config_type)
    return cfg


def _planned(name: str, plan, config_type, x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None,
             run=None):
    """Each problem's launch (config, kernel, grid: mma.Plan) is worked out on its first call and kept in
    :func:`trit.kernels.tuning.memo`; the host's work a call is then the launch itself (``run``: the module's
    own where a kernel launches more than the one kernel; else :func:`mma.run`)."""
    x2 = _flat(x)
    mma.check_x(x2, r, name)

    def make() -> mma.Plan:
        # the kernel is loaded for, and later launched on the stream of, x's GPU, whichever is current
        with torch.cuda.device(x2.device) if x2.is_cuda else contextlib.nullcontext():
            return plan(x2.shape[0], r, _tuned(name, x2, r, config_type), x2.device)

    p = tuning.memo(("plan", name, x2.shape[0], r.n, r.k, r.group_size, x2.device), make)
    return _finish((run or mma.run)(p, x2, r), x, bias)


def run_gemv(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_gemv", gemv.plan, gemv.GemvConfig, x, r, bias)


def run_imma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_imma", imma.plan, imma.ImmaConfig, x, r, bias)


def run_mma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_mma", mma.plan, mma.MmaConfig, x, r, bias)


def run_wgmma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_wgmma", wgmma.plan, wgmma.WgmmaConfig, x, r, bias)


def run_wgmma_a8(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_wgmma_a8", wgmma_a8.plan, wgmma.WgmmaConfig, x, r, bias, run=wgmma_a8.run)


def run_dequant(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, gemv.dequantize(r), bias)


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """BitNet's per-token int8 rounding of ``x`` and back (``x_q / s`` in ``x.dtype``), for the kernels that take
    W1.58A8 problems on bf16 or fp16 arithmetic: one Triton launch on CUDA, the reference elsewhere."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        from trit.kernels.triton.quantize import fake_quantize_rows

        return fake_quantize_rows(x)
    from trit.kernels.reference import fake_quantize_activations_int8

    return fake_quantize_activations_int8(x)


def reference(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    """Any device, any dtype: the layout's dense weight in float32, rounded once to ``x.dtype``."""
    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x.float(), mma.unpack_layout(r), b).to(x.dtype)


def dense(r: mma.MmaWeights, dtype: torch.dtype) -> torch.Tensor:
    """The layer's dense weight (N, K) in ``dtype`` (the backward pass multiplies the gradient by it)."""
    if r.wq.is_cuda and unavailable() is None:
        return gemv.dequantize(r).to(dtype)
    return mma.unpack_layout(r).to(dtype)
