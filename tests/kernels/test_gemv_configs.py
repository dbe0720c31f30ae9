"""The GEMV's config space and untuned default: valid tiles for any shape, no duplicate candidates."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from trit.kernels import gemv  # noqa: E402


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def test_candidates_are_distinct_powers_of_two() -> None:
    assert len(set(gemv.CONFIGS)) == len(gemv.CONFIGS)
    for c in gemv.CONFIGS:
        assert all(_pow2(v) for v in (c.block_n, c.block_kw, c.split_k, c.num_warps)), c


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(28672, 4096), (4096, 14336), (6144, 4096), (2048, 1536), (40, 576),
                                      (64, 96), (1536, 8960), (49152, 64)])
def test_default_config_fits_the_problem(n: int, k: int, m: int) -> None:
    c = gemv.default_config(n, k, m)
    kw = k // 16
    assert all(_pow2(v) for v in (c.block_n, c.block_kw, c.split_k, c.num_warps)), c
    assert c.block_kw <= max(kw, 4), c  # a step never spans more words than a row has (small rows: 4)
    assert c.split_k == 1 or kw // (c.block_kw * c.split_k) >= 1, c  # every split gets at least one step
    # large layers: more rows a program and narrower steps, so that more rows share each step's activations
    if n >= 4096 and m <= 2 and kw >= 32:
        assert (c.block_n, c.block_kw) == (64, 32)
