"""Run one ternary kernel a few times on one shape, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        -k regex:_gemv python benchmarks/profile_kernel.py gemv 4096 4096 1 64,64,2,4

The kernel is ``gemv``, ``skinny`` or ``gemm``; the config is its config class's fields, comma-separated.
"""

from __future__ import annotations

import sys

import torch

from trit.bench.kernels import ternary_layer
from trit.kernels import gemm, gemv, skinny


def main(kernel: str, n: int, k: int, m: int, config: str | None) -> None:
    packed, scale = ternary_layer(n, k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    fields = [int(v) for v in config.split(",")] if config else None
    if kernel == "gemv":
        cfg = gemv.GemvConfig(*fields) if fields else None
        run = lambda: gemv.gemv(x, packed.view(torch.int32), scale, 64, None, cfg)  # noqa: E731
    elif kernel == "skinny":
        cfg = skinny.SkinnyConfig(*fields) if fields else None
        run = lambda: skinny.skinny(x, packed.view(torch.int32), scale, 64, None, cfg)  # noqa: E731
    else:
        cfg = gemm.GemmConfig(*fields) if fields else None
        run = lambda: gemm.gemm(x, packed.view(torch.int32), scale, 64, None, cfg)  # noqa: E731
    for _ in range(3):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
