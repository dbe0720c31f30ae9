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
