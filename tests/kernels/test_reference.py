"""The reference linear follows the format literally, with and without int8 activations; the CPU kernel agrees with it."""

from __future__ import annotations

import pytest
import torch
from conftest import dense_weight, make_layer

from trit.kernels import cpu, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_linear(dtype: torch.dtype) -> None:
    values, packed, scale = make_layer(48, 576, 64)
    x = torch.randn(3, 576).to(dtype)
    bias = torch.randn(48).to(dtype)
    y = reference.linear(x, packed, scale, 64, bias)
    want = x.double() @ dense_weight(values, scale, 576).T + bias.double()
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)


@pytest.mark.parametrize(("n", "k", "group", "m"), [(40, 576, 64, 1), (33, 96, 32, 3), (17, 128, -1, 5), (9, 100, 64, 2)])
def test_cpu_kernel_matches_reference(n: int, k: int, group: int, m: int) -> None:
    _, packed, scale = make_layer(n, k, group, seed=n)
    assert cpu.refuse(packed.shape[1] * 4, group) is None
    x = torch.randn(m, k)
    bias = torch.randn(n)
    torch.testing.assert_close(cpu.linear(x, packed, scale, group, bias), reference.linear(x, packed, scale, group, bias),
                               rtol=1e-5, atol=1e-5)


def test_a_row_split_over_ranks_rounds_as_the_whole_row_with_the_shared_max() -> None:
    """Tensor parallelism's row-parallel layers: each rank rounds its part of a row by the max |x| of the whole
    row (all-reduced), and the parts put together are the whole row rounded."""
    x = torch.randn(5, 96) * torch.linspace(0.1, 3, 96)
    parts = x.split(48, dim=-1)
    amax = torch.stack([p.abs().amax(-1, keepdim=True) for p in parts]).amax(0)
    got = torch.cat([reference.fake_quantize_activations_int8(p, amax) for p in parts], dim=-1)
    assert torch.equal(got, reference.fake_quantize_activations_int8(x))
    assert not torch.equal(torch.cat([reference.fake_quantize_activations_int8(p) for p in parts], -1), got)
