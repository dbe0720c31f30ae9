"""The int8-rows Triton kernel (the 8-bit lm_head) against the reference: odd row counts, K not a multiple of
any block, each token-block config. On a GPU it runs directly; without one, test_triton_interpreted.py runs this
file under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from test_triton import CUDA, DEVICE, pytestmark  # noqa: E402, F401  (the same device choice and skip)

from trit.kernels import int8_rows  # noqa: E402
from trit.kernels.triton import int8_rows as kernel  # noqa: E402

SHAPES = [(130, 96), (200, 576)] + ([(128256, 4096), (49152, 576)] if CUDA else [])


@pytest.mark.parametrize("m", [1, 3, 17, 70])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernel_matches_the_reference(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(n + k + m)
    q, s = int8_rows.quantize_rows(torch.randn(n, k, generator=g) * 0.05)
    x = torch.randn(m, k, generator=g).to(dtype)
    ref = int8_rows.reference(x, q, s)
    q, s, x = q.to(DEVICE), s.to(DEVICE), x.to(DEVICE)
    y = kernel.linear(x, q, s)
    assert y.shape == (m, n) and y.dtype == dtype and torch.isfinite(y).all()
    err = (y.double().cpu() - ref.double()).norm() / ref.double().norm()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"relative error {err:.2e}"
    if CUDA:  # the op's dispatch takes the kernel, and the bias
        b = torch.randn(n, device=DEVICE, dtype=dtype)
        assert torch.equal(int8_rows.linear(x, q, s, b), y + b)


def test_a_strided_activation_and_no_tokens() -> None:
    q, s = int8_rows.quantize_rows(torch.randn(70, 64, generator=torch.Generator().manual_seed(1)))
    q, s = q.to(DEVICE), s.to(DEVICE)
    wide = torch.randn(4, 128, dtype=torch.bfloat16).to(DEVICE)
    x = wide[:, :64]  # rows 128 apart
    y = kernel.linear(x, q, s)
    ref = int8_rows.reference(x.cpu(), q.cpu(), s.cpu())
    assert ((y.double().cpu() - ref.double()).norm() / ref.double().norm()) < 1e-2
    assert kernel.linear(x[:0], q, s).shape == (0, 70)


def test_the_warm_up_compiles_every_default_config() -> None:
    every = {kernel.default_config(m) for m in range(1, 1025)}
    assert {kernel.default_config(m) for m in int8_rows.WARM_MS} == every
