"""absmean and TWN: the invariants every quantizer keeps, and each method's own promise."""

from __future__ import annotations

import pytest
import torch

from trit.quant import DATA_FREE, Method, dequantize_ternary, quantize, quantize_absmean, quantize_twn


@pytest.mark.parametrize("method", DATA_FREE)
@pytest.mark.parametrize("group", [16, 64, -1])
def test_invariants(method: Method, group: int) -> None:
    w = torch.randn(12, 128)
    t = quantize(w, group, method)
    groups = 1 if group == -1 else 128 // group
    assert t.values.dtype == torch.int8 and t.values.shape == w.shape
    assert set(t.values.unique().tolist()) <= {-1, 0, 1}
    assert t.scales.shape == (12, groups) and t.scales.dtype == torch.float32
    assert (t.scales > 0).all()
    # a nonzero value never points against its weight
    assert ((t.values.float() * w) >= 0).all()
    # scaling the weight scales the scales and keeps the codes
    t2 = quantize(w * 4.0, group, method)
    assert torch.equal(t2.values, t.values)
    torch.testing.assert_close(t2.scales, t.scales * 4.0)


def test_absmean_is_bitnet_rule() -> None:
    w = torch.randn(4, 64)
    t = quantize_absmean(w, 32)
    g = w.view(4, 2, 32)
    gamma = g.abs().mean(-1)
    torch.testing.assert_close(t.scales, gamma)
    expected = torch.clamp(torch.round(g / gamma[..., None]), -1, 1).view(4, 64)
    assert torch.equal(t.values.float(), expected)


def _group_error(w: torch.Tensor, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return ((w - values.float() * scale[..., None]) ** 2).sum(-1)


def test_twn_is_optimal_over_all_thresholds() -> None:
    torch.manual_seed(0)
    w = torch.randn(6, 16) * torch.rand(6, 1) * 3
    t = quantize_twn(w, 16)
    err = _group_error(w, t.values, t.scales[:, 0])
    for thr in w.abs().flatten().tolist() + [0.0]:  # every distinct ternary pattern, each with its best scale
        keep = w.abs() >= thr
        v = torch.sign(w) * keep
        a = (w.abs() * keep).sum(-1) / keep.sum(-1).clamp(min=1)
        assert (err <= _group_error(w, v, a) + 1e-5).all()


def test_twn_beats_absmean() -> None:
    w = torch.randn(64, 256)
    e_twn = ((w - dequantize_ternary(quantize_twn(w, 64))) ** 2).sum()
    e_abs = ((w - dequantize_ternary(quantize_absmean(w, 64))) ** 2).sum()
    assert e_twn < e_abs


def test_zero_group_is_all_zero() -> None:
    w = torch.zeros(2, 32)
    for method in DATA_FREE:
        t = quantize(w, 16, method)
        assert (t.values == 0).all()


def test_refuses_k_not_multiple_of_group() -> None:
    with pytest.raises(ValueError, match="not a multiple of the group size"):
        quantize(torch.randn(2, 40), 32)
