"""Launch one GEMV (a kernel file, a config) 24 times over 12 weight copies, for ncu to profile one launch.

    ncu --clock-control none -k regex:_gemv_kernel --launch-skip 14 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/results/gemv-variants/ncu_launch.py GEMV_FILE 28672 4096 64 64 1
"""

import sys

import torch

sys.path.insert(0, "src")
from sweep import load  # noqa: E402

from trit.bench.kernels import ternary_layer  # noqa: E402

gemv = load(sys.argv[1], "gemv_profiled")
n, k, bn, bkw, sk = (int(a) for a in sys.argv[2:7])
cfg = gemv.GemvConfig(bn, bkw, sk, 4)
x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
layers = [ternary_layer(n, k) for _ in range(12)]
for i in range(24):
    packed, scale = layers[i % 12]
    gemv.gemv(x, packed.view(torch.int32), scale, 64, None, cfg)
torch.cuda.synchronize()
