"""The GEMV's and the skinny GEMM's config spaces and untuned defaults; the shipped tuned table."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from trit.kernels import tuning  # noqa: E402
from trit.kernels.triton import gemv  # noqa: E402


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


@pytest.mark.parametrize("m", [1, 2, 16, 64])
@pytest.mark.parametrize(("n", "k", "group"), [(28672, 4096, 64), (4096, 14336, 64), (1536, 1536, 64), (40, 576, 32),
                                               (64, 96, -1), (17920, 1536, 128)])
def test_skinny_default_config_fits_the_problem(n: int, k: int, group: int, m: int) -> None:
    from trit.kernels.triton import skinny

    c = skinny.default_config(m, n, k, group)
    assert all(_pow2(v) for v in (c.block_n, c.block_k, c.split_k, c.num_warps)), c
    assert group == -1 or group % c.block_k == 0, c  # a step never spans two groups
    assert c.split_k == 1 or k // (c.block_k * c.split_k) >= 4, c  # each split keeps four steps or more
    assert len(set(skinny.configs_for(m, group))) == len(skinny.configs_for(m, group))


@pytest.mark.parametrize("table", sorted(p.name for p in tuning.SHIPPED.glob("*.json")))
def test_shipped_table_names_candidates_and_valid_configs(table: str) -> None:
    """Every choice in each shipped tuned table is a candidate of its layout, named as the registry names it; every
    config is of a kernel the registry has and builds that kernel's config."""
    import json

    from trit.kernels import registry
    from trit.kernels.cuda import gemv as cuda_gemv
    from trit.kernels.cuda import imma, mma, wgmma
    from trit.kernels.triton import gemm, skinny

    data = json.loads((tuning.SHIPPED / table).read_text())
    names = {k.name for k in registry.candidates()}
    assert set(data["choice"]) <= set(tuning.LAYOUTS) and any(data["choice"].values())
    assert all(c in names and c.startswith("triton_") for c in data["choice"].get("v1", {}).values())
    assert all(c in names and c.startswith("cuda_") for c in data["choice"].get("mma", {}).values())
    types = {"triton_gemv": gemv.GemvConfig, "triton_gemm": gemm.GemmConfig, "triton_skinny": skinny.SkinnyConfig,
             "cuda_gemv": cuda_gemv.GemvConfig, "cuda_imma": imma.ImmaConfig, "cuda_mma": mma.MmaConfig,
             "cuda_wgmma": wgmma.WgmmaConfig, "cuda_wgmma_a8": wgmma.WgmmaConfig}
    assert set(data["configs"]) <= set(types) and set(types) <= names
    for kernel, entries in data["configs"].items():
        for cfg in entries.values():
            types[kernel](**cfg)
