"""The CUDA candidates through ``trit::linear_tiled`` on a GPU: each size goes to its kernel and equals the
file layout's result (the refusals themselves are checked on the CPU in ``tests/kernels/test_registry.py``);
on the CPU, that each problem's launch is worked out once and kept until the tuned tables change."""

from __future__ import annotations

import pytest
import torch

import trit.ops  # noqa: F401  (registers trit::linear_tiled)
from trit import format as fmt
from trit.kernels import registry
from trit.kernels.cuda import launch, mma, wgmma
from trit.kernels.reference import linear as ref_linear
from trit.synthetic import random_packed

gpu = pytest.mark.skipif(not torch.cuda.is_available() or launch.unavailable() is not None,
                                reason="needs a GPU and NVRTC")


@gpu
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


@gpu
@pytest.mark.parametrize(("n", "k", "g"), [(4098, 576, 64), (33, 192, fmt.PER_ROW), (50, 640, 128)])
@pytest.mark.parametrize("m", [1, 3, 17, 100, 300, 2048])
def test_int8_activations_on_the_mma_layout_match_the_w158a8_reference(m: int, n: int, k: int, g: int) -> None:
    """W1.58A8 (BitNet's per-token int8 activations) through the mma layout's kernels, whichever each size goes
    to, against the reference's int8 arithmetic (exact integer sums, then the scales)."""
    from trit.kernels.reference import linear_a8

    kp = fmt.padded_k(k, g)
    packed = random_packed((n, kp // 4), "cuda")
    scale = (torch.rand(n, fmt.num_groups(g, kp), device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
    r = mma.repack(packed, scale, g, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda") * torch.rand(m, 1, device="cuda").to(torch.bfloat16)
    y = torch.ops.trit.linear_tiled(x, r.wq, r.sc, n, g, None, True).float()
    want = linear_a8(x.float(), packed, scale.float(), g).float()
    assert float((y - want).norm() / want.norm()) < 1e-2
    plain = torch.ops.trit.linear_tiled(x, r.wq, r.sc, n, g, None).float()
    assert float((plain - want).norm() / want.norm()) > float((y - want).norm() / want.norm())  # rounded, really


def test_a_problems_launch_is_planned_once_until_the_tables_change(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels import tuning

    BF16 = torch.bfloat16  # noqa: N806
    planned, ran = [], []

    def plan(m, r, config, device):
        planned.append((m, config))
        return f"plan {m} #{len(planned)}"

    def run(p, x2, r):
        ran.append((p, tuple(x2.shape)))
        return torch.ones(x2.shape[0], r.n)

    monkeypatch.setattr(launch.mma, "run", run)
    monkeypatch.setattr(tuning, "_MEMO", {})
    r = mma.MmaWeights(torch.zeros(3, 1, 32, 4, dtype=torch.int32), torch.zeros(3, 1, 8, dtype=torch.int32), 40, 128, 128)
    bias = torch.arange(40.0)
    y = launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(2, 3, 128, dtype=BF16), r, bias)  # (2, 3, K): 6 rows
    assert y.shape == (2, 3, 40) and torch.equal(y[1, 2], 1 + bias)
    launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(6, 128, dtype=BF16), r, None)
    assert planned == [(6, None)] and [p for p, _ in ran] == ["plan 6 #1"] * 2 and ran[0][1] == (6, 128)
    launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(5, 128, dtype=BF16), r, None)  # another M: its own plan
    assert planned[-1] == (5, None)
    key = tuning.key(6, 40, 128, 128, BF16)
    monkeypatch.setattr(tuning, "_TABLES", {"configs": {}, "choice": {}})
    tuning.remember("cuda_mma", key, mma.MmaConfig(rt=1), persist=False)  # a config tuned now: planned again
    launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(6, 128, dtype=BF16), r, None)
    assert planned[-1] == (6, mma.MmaConfig(rt=1)) and ran[-1][0] == "plan 6 #3"
    monkeypatch.setattr(tuning, "MEMO_MAX", 2)  # bounded: full (M = 6 and 7 planned), it starts again
    for m in (7, 8):
        launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(m, 128, dtype=BF16), r, None)
    assert [key[2] for key in tuning._MEMO] == [8]
    with pytest.raises(ValueError, match="takes bf16 x with K = 128"):  # the refusals send nothing else; checked
        launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(6, 128), r, None)
    with pytest.raises(ValueError, match="takes bf16 x with K = 128"):
        launch._planned("cuda_mma", plan, mma.MmaConfig, torch.zeros(6, 64, dtype=BF16), r, None)
