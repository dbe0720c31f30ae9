"""The CUDA candidates for :func:`trit.ops.choose_kernel`: what each Triton kernel accepts, and how it is called.

Each candidate is a refusal check (``None`` when it can run the problem, else
the reason) and a runner that flattens the activations, views the packed codes
as int32 words (no copy) and picks the kernel config: the tuned table entry for
the problem if there is one (:mod:`trit.kernels.tuning`), else the kernel's
heuristic default.
"""

from __future__ import annotations

import torch

from trit.format import padded_k
from trit.kernels import dequant, gemm, gemv, tuning

# from this many rows up, dequantize + cuBLAS beats decoding in registers (benchmarks/results)
DEQUANT_MIN_M = 1024
# without a tuned choice, the GEMV takes M = 1 only (benchmarks/results: the GEMM wins from M = 2 or so)
GEMV_MAX_M_UNTUNED = 1


def common_refusal(p) -> str | None:
    if p.device_type != "cuda":
        return f"runs on CUDA, not {p.device_type}"
    if p.dtype not in (torch.bfloat16, torch.float16):
        return f"activations are {str(p.dtype).removeprefix('torch.')}; the Triton kernels take bf16 or fp16"
    if padded_k(p.k, p.group_size) % 16:
        return f"K_pad = {padded_k(p.k, p.group_size)} is not a multiple of 16 (one int32 word of codes)"
    if p.group_size != -1 and p.group_size % 16:
        return f"group size {p.group_size} is not a multiple of 16"
    return None


def _prefers_other(p, name: str) -> str | None:
    choice = tuning.preferred(tuning.key(p.m, p.n, p.k, p.group_size, p.dtype))
    if choice is not None and choice != name:
        return f"the tuned table measured triton_{choice} faster for this problem"
    return None


def refuse_gemv(p) -> str | None:
    if p.m > gemv.MAX_M:
        return f"M = {p.m} > {gemv.MAX_M}: the GEMV unrolls at most {gemv.MAX_M} rows"
    if p.m > GEMV_MAX_M_UNTUNED and tuning.preferred(tuning.key(p.m, p.n, p.k, p.group_size, p.dtype)) is None:
        return f"M = {p.m} > {GEMV_MAX_M_UNTUNED} and no tuned choice: the GEMM is faster there as a rule"
    return common_refusal(p) or _prefers_other(p, "gemv")


def refuse_gemm(p) -> str | None:
    if p.m >= DEQUANT_MIN_M:
        return f"M = {p.m} >= {DEQUANT_MIN_M}: dequantize + cuBLAS is faster there"
    return common_refusal(p) or _prefers_other(p, "gemm")


def refuse_dequant(p) -> str | None:
    return common_refusal(p)


def _flat(x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (M, K) with unit stride along K
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def run_gemv(x, packed, scale, group_size, bias=None):
    x2 = _flat(x)
    m, k = x2.shape
    n = packed.shape[0]
    cfg = tuning.lookup("gemv", tuning.key(m, n, k, group_size, x.dtype), gemv.GemvConfig)
    if cfg is None and tuning.autotune_enabled():
        cfg = _tune("gemv", x2, packed, scale, group_size, gemv.CONFIGS)
    y = gemv.gemv(x2, packed.view(torch.int32), scale, group_size, bias, cfg)
    return y.view(*x.shape[:-1], n)


def run_gemm(x, packed, scale, group_size, bias=None):
    x2 = _flat(x)
    m, k = x2.shape
    n = packed.shape[0]
    cfg = tuning.lookup("gemm", tuning.key(m, n, k, group_size, x.dtype), gemm.GemmConfig)
    if cfg is None and tuning.autotune_enabled():
        cfg = _tune("gemm", x2, packed, scale, group_size, gemm.configs_for(m, group_size))
    y = gemm.gemm(x2, packed.view(torch.int32), scale, group_size, bias, cfg)
    return y.view(*x.shape[:-1], n)


def run_dequant(x, packed, scale, group_size, bias=None):
    x2 = _flat(x)
    y = dequant.linear(x2, packed.view(torch.int32), scale, group_size, bias)
    return y.view(*x.shape[:-1], packed.shape[0])


def _tune(kernel: str, x2, packed, scale, group_size, candidates):
    launch = {"gemv": gemv.gemv, "gemm": gemm.gemm}[kernel]
    words = packed.view(torch.int32)
    best, _ = tuning.tune(lambda cfg: [lambda: launch(x2, words, scale, group_size, None, cfg)] * 20, candidates)
    m, k = x2.shape
    tuning.remember(kernel, tuning.key(m, packed.shape[0], k, group_size, x2.dtype), best)
    return best
