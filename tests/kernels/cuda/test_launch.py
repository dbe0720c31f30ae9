"""The CUDA candidates through ``trit::linear_tiled`` on a GPU: each size goes to its kernel and equals the
file layout's result (the refusals themselves are checked on the CPU in ``tests/kernels/test_registry.py``)."""

from __future__ import annotations

import pytest
import torch

import trit.ops  # noqa: F401  (registers trit::linear_tiled)
from trit import format as fmt
from trit.kernels import registry
from trit.kernels.cuda import launch, mma, wgmma
from trit.kernels.reference import linear as ref_linear
from trit.synthetic import random_packed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or launch.unavailable() is not None,
                                reason="needs a GPU and NVRTC")


@pytest.mark.parametrize(("n", "k", "g"), [(4098, 576, 64), (130, 256, 32), (33, 192, fmt.PER_ROW), (50, 640, 128)])
@pytest.mark.parametrize("m", [1, 3, 17, 100, 300])
def test_each_size_runs_its_kernel_and_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    kp = fmt.padded_k(k, g)
    packed = random_packed((n, kp // 4), "cuda")
    scale = (torch.rand(n, fmt.num_groups(g, kp), device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
    r = mma.repack(packed, scale, g, k)
    x = torch.randn(2, m, k, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    problem = registry.Problem(2 * m, n, k, g, "cuda", torch.bfloat16, layout="mma")
    chosen = registry.choose_kernel(problem).kernel.name
    hopper = launch._wgmma_support(torch.cuda.current_device()) is None
    want_kernel = ("cuda_gemv" if 2 * m <= launch.GEMV_MAX_M else
                   "cuda_wgmma" if hopper and wgmma.MIN_M <= 2 * m <= wgmma.MAX_M else
                   "cuda_mma" if 2 * m <= mma.MAX_M else "cuda_dequant_cublas")
    assert chosen == want_kernel
    y = torch.ops.trit.linear_tiled(x, r.wq, r.sc, n, g, bias).float()
    want = ref_linear(x, packed, scale, g, bias).float()
    assert y.shape == (2, m, n)
    assert float((y - want).norm() / want.norm()) < 1e-2
