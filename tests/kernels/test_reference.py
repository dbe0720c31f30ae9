"""The reference path follows the format literally; the CPU kernel and the op agree with it."""

from __future__ import annotations

import pytest
import torch

from trit import format as fmt
from trit import ops
from trit.kernels import cpu, reference


def make_layer(n: int, k: int, group: int, seed: int = 0, scale_dtype=torch.float16):
    """Random ternary layer in the file layout, padded as the converter pads (zero weights)."""
    g = torch.Generator().manual_seed(seed)
    k_pad = fmt.padded_k(k, group)
    values = torch.randint(-1, 2, (n, k_pad), generator=g, dtype=torch.int8)
    values[:, k:] = 0
    groups = 1 if group == -1 else k_pad // group
    scale = (torch.rand(n, groups, generator=g) * 0.05 + 0.01).to(scale_dtype)
    return values, fmt.pack(values), scale


def dense(values: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:  # (N, k) float64
    n, k_pad = values.shape
    per = k_pad // scale.shape[1]
    return (values.double().view(n, scale.shape[1], per) * scale.double()[:, :, None]).view(n, k_pad)[:, :k]


@pytest.mark.parametrize(("n", "k", "group"), [(8, 64, 32), (5, 576, 64), (7, 576, 128), (3, 20, -1), (4, 100, 12)])
def test_dequantize_is_the_format(n: int, k: int, group: int) -> None:
    values, packed, scale = make_layer(n, k, group)
    w = reference.dequantize(packed, scale, group, k, torch.float64)
    torch.testing.assert_close(w, dense(values, scale, k), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_linear(dtype: torch.dtype) -> None:
    values, packed, scale = make_layer(48, 576, 64)
    x = torch.randn(3, 576).to(dtype)
    bias = torch.randn(48).to(dtype)
    y = reference.linear(x, packed, scale, 64, bias)
    want = x.double() @ dense(values, scale, 576).T + bias.double()
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


def test_choose_kernel_explains_refusals() -> None:
    choice = ops.choose_kernel(ops.Problem(1, 64, 96, 12, "cpu", torch.float32))
    assert choice.kernel is ops.REFERENCE
    assert any(name == "cpu_words" and "group size 12 is not a multiple of 16" in why for name, why in choice.refused)
    assert "reference: chosen" in choice.explain()
    assert ops.choose_kernel(ops.Problem(1, 64, 576, 64, "cpu", torch.float32)).kernel is ops.CPU


def test_custom_op_passes_opcheck() -> None:
    _, packed, scale = make_layer(24, 64, 32)
    x = torch.randn(2, 3, 64)
    bias = torch.randn(24)
    torch.library.opcheck(torch.ops.trit.linear.default, (x, packed, scale, 32, bias))
    torch.library.opcheck(torch.ops.trit.linear.default, (x, packed, scale, 32, None))
    y = torch.ops.trit.linear(x, packed, scale, 32, bias)
    assert y.shape == (2, 3, 24)
    torch.testing.assert_close(y, reference.linear(x, packed, scale, 32, bias), rtol=1e-5, atol=1e-5)
