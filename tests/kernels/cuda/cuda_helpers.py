"""Helpers of the CUDA kernels' tests: a random layer in format v1, and whether NVRTC is installed."""

from __future__ import annotations

import torch

from trit import format as fmt
from trit.kernels.cuda import nvrtc
from trit.synthetic import random_packed


def random_layer(n: int, k: int, g: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes (never 3) packed as format v1 says, and fp16 scales, for an (N, K) layer with groups of ``g``."""
    kp = fmt.padded_k(k, g)
    packed = random_packed((n, kp // 4), device)
    scale = (torch.rand(n, fmt.num_groups(g, kp), device=device) * 0.02 + 0.005).half()
    return packed, scale


def have_nvrtc() -> bool:
    try:
        nvrtc.nvrtc()
    except nvrtc.CudaUnavailable:
        return False
    return True


def check_layout_kernel(linear, configs, m: int, n: int, k: int, g: int) -> None:
    """A kernel of the mma layout (``linear(x, r, cfg)``) against the float32 reference on a random (N, K) layer
    with groups of ``g`` and M rows, for each config, twice (split-K must leave its workspace zero): within twice
    the error bf16 ``F.linear`` makes on the layout's own dense weight."""
    from trit.kernels.cuda import mma
    from trit.kernels.reference import linear as ref_linear

    packed, scale = random_layer(n, k, g, "cuda")
    r = mma.repack(packed, scale, g, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    want = ref_linear(x, packed, scale, g).float()
    dense = torch.nn.functional.linear(x, mma.unpack_layout(r).to(torch.bfloat16)).float()
    bound = 2 * float((dense - want).norm() / want.norm()) + 1e-3
    for cfg in configs:
        for _ in range(2):
            y = linear(x, r, cfg).float()
            err = float((y - want).norm() / want.norm())
            assert err < bound, (cfg, err)


def activations(m: int, k: int, device: str = "cpu") -> torch.Tensor:
    """bf16 activations with an outlier channel of each sign: their steps keep fewer bits, and the int8 kernel's
    high bytes take both signs."""
    x = torch.randn(m, k, device=device)
    x[:, 5] *= 60
    x[:, 7] = -x[:, 5]
    return x.to(torch.bfloat16)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def check_against_gemv_emulation(linear, configs, m: int, n: int, k: int, g: int) -> None:
    """A few-token kernel of the mma layout (``linear(x, r, cfg)``: the GEMV, the int8 GEMV) against the GEMV's
    emulation (to the bf16 rounding of the output) and the reference (within twice the error of bf16 ``F.linear``
    on the layout's dense weight), each config twice: split-K leaves its workspace zero for the next call."""
    from trit.kernels.cuda import gemv, mma
    from trit.kernels.reference import linear as ref_linear

    packed, scale = random_layer(n, k, g, "cuda")
    r = mma.repack(packed, scale, g, k)
    x = activations(m, k, "cuda")
    want = ref_linear(x, packed, scale, g).float()
    emulated = gemv.emulate(x, r)
    dense = torch.nn.functional.linear(x, mma.unpack_layout(r).to(torch.bfloat16)).float()
    bound = 2 * rel(dense, want) + 1e-3
    for cfg in configs:
        for _ in range(2):
            y = linear(x, r, cfg)
            assert rel(y, emulated) < 4e-3, cfg
            assert rel(y, want) < bound, cfg
