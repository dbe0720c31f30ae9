"""The chunked dequantize + cuBLAS path's arithmetic on the CPU: slices of the weight through one buffer give
the one-shot product; the buffer's size comes from TRIT_DEQUANT_CHUNK_MB."""

from __future__ import annotations

import pytest
import torch

from trit import format as fmt
from trit.kernels import chunked
from trit.synthetic import random_packed


def _layer(n: int, k: int, g: int = 64) -> torch.Tensor:
    torch.manual_seed(n + k)
    packed = random_packed((n, k // 4), "cpu")
    scale = torch.rand(n, fmt.num_groups(g, k)) * 0.02 + 0.005
    return fmt.dequantize(packed, scale, k, torch.float32)


@pytest.mark.parametrize("rows", [1, 7, 16, 33, 40, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_slices_through_one_buffer_give_the_one_shot_product(rows: int, bias: bool) -> None:
    n, k = 40, 128
    w = _layer(n, k)
    x = torch.randn(6, k)
    b = torch.randn(n) if bias else None
    outs, seen = [], []

    def dequant_rows(r0: int, r1: int, out: torch.Tensor | None) -> torch.Tensor:
        seen.append((r0, r1))
        outs.append(None if out is None else out.data_ptr())
        if out is None:
            return w[r0:r1].clone()
        out.copy_(w[r0:r1])
        return out

    y = chunked.linear(x.view(2, 3, k), n, dequant_rows, b, rows)  # leading dimensions kept
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b).view(2, 3, n), rtol=1e-5, atol=1e-5)
    assert y.shape == (2, 3, n) and y.is_contiguous()
    if rows >= n:
        assert seen == [(0, n)] and outs == [None]  # one piece: no buffer
    else:
        assert seen == [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]
        assert len(set(outs)) == 1  # every slice went through the same buffer


def test_bf16_slices_match_the_one_shot_bf16_product() -> None:
    n, k = 48, 256
    w = _layer(n, k).bfloat16()
    x = torch.randn(5, k).bfloat16()

    def dequant_rows(r0, r1, out):
        return w[r0:r1] if out is None else out.copy_(w[r0:r1])

    b = torch.randn(n).bfloat16()
    for bias in (None, b):  # the bias inside each slice's GEMM: the one-piece product's single rounding
        torch.testing.assert_close(chunked.linear(x, n, dequant_rows, bias, 16),
                                   torch.nn.functional.linear(x, w, bias), rtol=2**-7, atol=1e-2)


def test_rows_a_chunk() -> None:
    assert chunked.rows_per_chunk(28672, 4096, 2, 0) == 28672  # 0: one piece
    assert chunked.rows_per_chunk(28672, 4096, 2, 24 * 2**20) == 3072
    assert chunked.rows_per_chunk(28672, 4096, 2, 24 * 2**20, align=1000) == 3000
    assert chunked.rows_per_chunk(100, 4096, 2, 2**30) == 100  # the whole weight fits: one piece
    assert chunked.rows_per_chunk(28672, 4096, 2, 1, align=16) == 16  # never fewer than one aligned block


def test_the_buffer_size_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(chunked.ENV, raising=False)
    assert chunked.chunk_bytes() == chunked.DEFAULT_MB * 2**20
    monkeypatch.setenv(chunked.ENV, "24")
    assert chunked.chunk_bytes() == 24 * 2**20
    monkeypatch.setenv(chunked.ENV, "0.5")
    assert chunked.chunk_bytes() == 2**19
    for bad in ("-1", "lots"):
        monkeypatch.setenv(chunked.ENV, bad)
        with pytest.raises(ValueError, match=f"{chunked.ENV}={bad!r}: expected a size in MiB"):
            chunked.chunk_bytes()
