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
