"""The int8 output layer: the rounding, and every path of the product against the plain-PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from trit.kernels import int8_rows


def _head(n: int = 300, k: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_rows_round_to_127_steps_of_their_own_scale() -> None:
    w = _head()
    w[7] = 0  # an all-zero row: a tiny scale, zero codes, no division by zero
    q, s = int8_rows.quantize_rows(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (300,)
    assert int(q.abs().max()) == 127 and int(q[7].abs().max()) == 0
    assert torch.equal(q[0].float(), torch.round(w[0] / (w[0].abs().max() / 127)))
    back = int8_rows.dequantize_rows(q, s, torch.float32)
    assert ((back - w).abs() <= s[:, None] / 2 + 1e-7).all()  # within half a step of every row's scale
    with pytest.raises(ValueError, match="an \\(N, K\\) float matrix"):
        int8_rows.quantize_rows(q)


def test_the_reference_is_the_dequantized_product() -> None:
    w = _head()
    q, s = int8_rows.quantize_rows(w)
    x = torch.randn(3, 96, dtype=torch.float64).float()
    bias = torch.randn(300)
    ref = int8_rows.reference(x, q, s, bias)
    assert torch.allclose(ref, x @ int8_rows.dequantize_rows(q, s, torch.float32).T + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (2, 3, 96), (3, 100), (2, 60)])
def test_the_product_on_the_cpu_matches_the_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """torch's int8 matmul where K is a multiple of 8, the reference where it is not (the fast path returns
    garbage there)."""
    q, s = int8_rows.quantize_rows(_head(k=shape[-1]))
    x = torch.randn(*shape).to(dtype)
    assert int8_rows.cpu_fast_path(x, q) == (shape[-1] % 8 == 0 and hasattr(torch, "_weight_int8pack_mm"))
    y, ref = int8_rows.linear(x, q, s), int8_rows.reference(x, q, s)
    assert y.shape == (*shape[:-1], 300) and y.dtype == dtype
    err = (y.double() - ref.double()).norm() / ref.double().norm()
    assert err < (1e-2 if dtype == torch.bfloat16 else 1e-5), err


def test_the_module_keeps_its_scales_in_float32_through_a_cast() -> None:
    w = _head()
    m = int8_rows.Int8RowsLinear(w)
    q, s = int8_rows.quantize_rows(w)
    assert torch.equal(m.q, q) and torch.equal(m.s, s)
    m.to(torch.bfloat16)
    assert m.q.dtype == torch.int8 and m.s.dtype == torch.float32 and torch.equal(m.s, s)
    x = torch.randn(2, 96, dtype=torch.bfloat16)
    assert torch.equal(m(x), int8_rows.linear(x, q, s))
