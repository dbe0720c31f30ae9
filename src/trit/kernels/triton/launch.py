"""The Triton candidates of :func:`trit.kernels.registry.choose_kernel`: what each kernel accepts, and how it is called.

Each candidate is a refusal check (``None`` when it can run the problem, else
the reason) and a runner that flattens the activations, views the packed codes
as int32 words (no copy) and picks the kernel config: the tuned table entry for
the problem if there is one (:mod:`trit.kernels.tuning`), else the kernel's
heuristic default.
"""

from __future__ import annotations

import torch

from trit import format as fmt
from trit.kernels import tuning
from trit.kernels.triton import dequant, gemm, gemm_a8, gemv, skinny

# the rules of thumb where no tuned table names a kernel (docs/kernels.md has the measurements behind them):
# from this many rows up, dequantize + cuBLAS beats decoding in registers; below, the GEMM
DEQUANT_MIN_M = 128
# without a tuned choice, the GEMV takes M = 1 only (the GEMM wins from M = 2 or so)
GEMV_MAX_M_UNTUNED = 1


def common_refusal(p) -> str | None:
    if p.device_type != "cuda":
        return f"runs on CUDA, not {p.device_type}"
    if p.dtype not in (torch.bfloat16, torch.float16):
        return f"activations are {str(p.dtype).removeprefix('torch.')}; the Triton kernels take bf16 or fp16"
    if fmt.padded_k(p.k, p.group_size) % 16:
        return f"K_pad = {fmt.padded_k(p.k, p.group_size)} is not a multiple of 16 (one int32 word of codes)"
    if not fmt.steps_fit_groups(p.group_size, 16):
        return f"group size {p.group_size} is not a multiple of 16"
    return None


def refuse_gemv(p) -> str | None:
    if p.m > gemv.MAX_M:
        return f"M = {p.m} > {gemv.MAX_M}: the GEMV unrolls at most {gemv.MAX_M} rows"
    return common_refusal(p)


def rule_gemv(p) -> str | None:
    return None if p.m <= GEMV_MAX_M_UNTUNED else f"M = {p.m} > {GEMV_MAX_M_UNTUNED}: the GEMM is faster there"


def refuse_skinny(p) -> str | None:
    if p.m > skinny.MAX_M:
        return f"M = {p.m} > {skinny.MAX_M}: the skinny GEMM's narrow side is at most {skinny.MAX_M} rows"
    if not fmt.steps_fit_groups(p.group_size, 32):
        return f"group size {p.group_size} is not a multiple of 32 (the skinny GEMM's step)"
    return common_refusal(p) or _capability_refusal()


def rule_skinny(p) -> str | None:
    return "M = 1: the GEMV is faster there" if p.m == 1 else None


def _capability_refusal() -> str | None:
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"compute capability {major}.{minor} < 8.0: no paired bf16 FMA"
    return None


def refuse_gemm(p) -> str | None:
    return common_refusal(p)


def rule_gemm(p) -> str | None:
    return f"M = {p.m} >= {DEQUANT_MIN_M}: dequantize + cuBLAS is faster there" if p.m >= DEQUANT_MIN_M else None


def refuse_dequant(p) -> str | None:
    return common_refusal(p)


def refuse_gemm_a8(p) -> str | None:
    if not p.act_int8:
        return "the activations are not int8-quantized (a W1.58A8 kernel)"
    if not fmt.steps_fit_groups(p.group_size, 32):
        return f"group size {p.group_size} is not a multiple of 32 (the int8 dot's K step)"
    return common_refusal(p)


def rule_gemm_a8(p) -> str | None:
    return "it runs where a tuned table measured it fastest; by rule the bf16 kernels take x_q / s"


def _flat(x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (M, K) with unit stride along K
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _run_tuned(name: str, launch, config_type, candidates, x, packed, scale, group_size, bias):
    """Flatten, look the config up (or tune it with TRIT_AUTOTUNE=1), launch, restore the leading dims."""
    x2 = _flat(x)
    m, k = x2.shape
    n = packed.shape[0]
    words = packed.view(torch.int32)
    key = tuning.key(m, n, k, group_size, x.dtype, name.startswith("triton_gemm_a8"))
    cfg = tuning.lookup(name, key, config_type)
    if cfg is None and tuning.autotune_enabled():
        calls = lambda c: [lambda: launch(x2, words, scale, group_size, None, c)] * 20  # noqa: E731
        cfg, _ = tuning.tune(calls, candidates(m, group_size))
        tuning.remember(name, key, cfg)
    return launch(x2, words, scale, group_size, bias, cfg).view(*x.shape[:-1], n)


def run_gemv(x, packed, scale, group_size, bias=None):
    return _run_tuned("triton_gemv", gemv.gemv, gemv.GemvConfig, lambda m, g: gemv.CONFIGS,
                      x, packed, scale, group_size, bias)


def run_skinny(x, packed, scale, group_size, bias=None):
    return _run_tuned("triton_skinny", skinny.skinny, skinny.SkinnyConfig, skinny.configs_for, x, packed, scale, group_size,
                      bias)


def run_gemm(x, packed, scale, group_size, bias=None):
    return _run_tuned("triton_gemm", gemm.gemm, gemm.GemmConfig, gemm.configs_for, x, packed, scale, group_size, bias)


# from this many rows up, with one scale per row, the int8 GEMM reads a dense int8 copy of the codes
A8_DENSE_MIN_M = 256


def run_gemm_a8(x, packed, scale, group_size, bias=None):
    if group_size == fmt.PER_ROW and x.numel() // x.shape[-1] >= A8_DENSE_MIN_M:
        return _run_tuned("triton_gemm_a8_dense", gemm_a8.dense_a8, gemm_a8.GemmA8Config, lambda m, g: gemm_a8.dense_configs(),
                          x, packed, scale, group_size, bias)
    return _run_tuned("triton_gemm_a8", gemm_a8.gemm_a8, gemm_a8.GemmA8Config, gemm_a8.configs_for,
                      x, packed, scale, group_size, bias)


def run_dequant(x, packed, scale, group_size, bias=None):
    x2 = _flat(x)
    y = dequant.linear(x2, packed.view(torch.int32), scale, group_size, bias)
    return y.view(*x.shape[:-1], packed.shape[0])
