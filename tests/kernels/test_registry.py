"""Kernel choice: the ordered candidates, the reasons each refusal gives, and switching a kernel off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trit.kernels import registry
from trit.kernels.cuda import mma


def pin_tables(monkeypatch: pytest.MonkeyPatch, tables: dict | None) -> None:
    """Stand ``tables`` in for the tuned tables (``None``: the shipped default, read from the files), with no GPU
    in use: a test that started CUDA earlier in the session must not make them be read again for its GPU."""
    from trit.kernels import tuning

    monkeypatch.setattr(tuning, "_TABLES", tables)
    monkeypatch.setattr(tuning, "_TABLES_DEVICE", None)
    monkeypatch.setattr(tuning, "_device_name", lambda: None)


def test_choose_kernel_explains_refusals() -> None:
    choice = registry.choose_kernel(registry.Problem(1, 64, 96, 12, "cpu", torch.float32))
    assert choice.kernel is registry.REFERENCE
    assert any(name == "cpu_words" and "group size 12 is not a multiple of 16" in why for name, why in choice.refused)
    assert "reference: chosen" in choice.explain()
    assert registry.choose_kernel(registry.Problem(17, 64, 576, 64, "cpu", torch.float32)).kernel is registry.CPU


def test_a_disabled_kernel_is_passed_over_with_its_reason() -> None:
    problem = registry.Problem(17, 64, 576, 64, "cpu", torch.float32)
    try:
        registry.disable("cpu_words")
        choice = registry.choose_kernel(problem)
        assert choice.kernel is registry.REFERENCE
        assert ("cpu_words", "disabled (TRIT_DISABLE_KERNELS or registry.disable)") in choice.refused
    finally:
        registry.disable()
    assert registry.choose_kernel(problem).kernel is registry.CPU
    with pytest.raises(ValueError, match="no kernel named nope; the kernels are .*cpu_words"):
        registry.disable("nope")


def test_the_native_cpu_kernel_takes_decode_sizes_and_says_why_not_others() -> None:
    from trit.kernels import cpu_native

    if cpu_native.module() is None:
        pytest.fail(f"the native CPU kernel did not build here: {cpu_native.build_error()}")
    assert registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.float32)).kernel is registry.NATIVE
    refused = dict(registry.choose_kernel(registry.Problem(17, 64, 576, 64, "cpu", torch.float32)).refused)
    assert refused["cpu_native"] == "M = 17 > 16: dequantize + one float matmul is faster there"
    refused = dict(registry.choose_kernel(registry.Problem(1, 64, 96, 32, "cpu", torch.float32)).refused)
    assert refused["cpu_native"] == "K_pad = 96 is not a multiple of 64 (one 16-byte chunk of codes)"


def test_the_two_layouts_go_to_their_own_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels.cuda import launch

    v1 = registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.float32))
    assert ("cuda_gemv", "reads the mma layout only") in v1.refused and not v1.kernel.name.startswith("cuda")
    tiled = registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.bfloat16, layout="mma"))
    assert tiled.kernel is registry.REFERENCE
    assert ("cpu_words", "reads format v1, not the mma layout") in tiled.refused
    assert ("cuda_gemv", "runs on CUDA, not cpu") in tiled.refused
    # on a GPU where NVRTC compiles: each size to its kernel by the rule, with no tuned table (the refusals
    # themselves, with no GPU needed)

    monkeypatch.setattr(launch, "unavailable", lambda: None)
    pin_tables(monkeypatch, {})
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: "wgmma needs sm_90 (Hopper); this GPU is sm_89")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for m, name in ((1, "cuda_gemv"), (launch.GEMV_MAX_M, "cuda_gemv"), (launch.GEMV_MAX_M + 1, "cuda_mma"),
                    (64, "cuda_mma"), (65, "cuda_dequant_cublas"), (4096, "cuda_dequant_cublas")):
        p = registry.Problem(m, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma")
        assert next(k.name for k in registry.CUDA if k.refuse(p) is None) == name, m
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: None)  # an sm_90 GPU: wgmma from 64 to 256 rows
    for m, name in ((launch.GEMV_MAX_M + 1, "cuda_mma"), (63, "cuda_mma"), (64, "cuda_wgmma"), (256, "cuda_wgmma"),
                    (257, "cuda_dequant_cublas")):
        p = registry.Problem(m, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma")
        assert next(k.name for k in registry.CUDA if k.refuse(p) is None) == name, m
    half = registry.Problem(1, 4096, 4096, 64, "cuda", torch.float16, layout="mma")
    assert all("bf16" in k.refuse(half) for k in registry.CUDA)


def test_the_tuned_table_picks_among_the_mma_layouts_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels import tuning
    from trit.kernels.cuda import launch

    monkeypatch.setattr(launch, "unavailable", lambda: None)
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    pin_tables(monkeypatch, {"choice_mma": {}})
    first = {}
    for m in (2, 4, 32):
        p = registry.Problem(m, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma")
        first[m] = lambda p=p: next(k.name for k in registry.CUDA if k.refuse(p) is None)
    assert (first[2](), first[4](), first[32]()) == ("cuda_gemv", "cuda_gemv", "cuda_mma")  # no entry: the rule
    tuning.prefer(tuning.key(4, 4096, 4096, 64, torch.bfloat16), "cuda_mma", "choice_mma")
    tuning.prefer(tuning.key(32, 4096, 4096, 64, torch.bfloat16), "cuda_dequant_cublas", "choice_mma")
    assert (first[2](), first[4](), first[32]()) == ("cuda_gemv", "cuda_mma", "cuda_dequant_cublas")
    tuning.prefer(tuning.key(2, 4096, 4096, 64, torch.bfloat16), "cuda_imma", "choice_mma")
    tuning.prefer(tuning.key(32, 4096, 4096, 64, torch.bfloat16), "cuda_imma", "choice_mma")
    assert (first[2](), first[4](), first[32]()) == ("cuda_imma", "cuda_mma", "cuda_imma")
    assert tuning.preferred(tuning.key(4, 4096, 4096, 64, torch.bfloat16)) is None  # format v1's choice apart


def test_the_mma_kernel_takes_more_than_64_rows_only_where_the_table_chose_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels import tuning
    from trit.kernels.cuda import launch

    monkeypatch.setattr(launch, "unavailable", lambda: None)
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: "wgmma needs sm_90 (Hopper); this GPU is sm_80")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    pin_tables(monkeypatch, {"choice_mma": {}})
    p = registry.Problem(100, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma")
    assert "no tuned choice" in launch.refuse_mma(p)
    tuning.prefer(tuning.key(100, 4096, 4096, 64, torch.bfloat16), "cuda_mma", "choice_mma")  # the 128 bucket
    assert launch.refuse_mma(p) is None
    assert registry.choose_kernel(p).kernel.name == "cuda_mma"
    big = registry.Problem(300, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma")  # the 512 bucket: no entry
    assert registry.choose_kernel(big).kernel.name == "cuda_dequant_cublas"


def test_a_choice_recorded_before_the_tables_are_read_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """`trit bench kernels` may tune a problem before anything has read the shipped tables."""
    from trit.kernels import tuning

    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    pin_tables(monkeypatch, None)
    key = tuning.key(100, 4096, 4096, 64, torch.bfloat16)
    tuning.prefer(key, "cuda_mma", "choice_mma")
    tuning.remember("cuda_mma", key, mma.MmaConfig(1, 1, 1, 3, False, 4, 8), persist=False)
    assert tuning.preferred(key, "choice_mma") == "cuda_mma"
    assert tuning.lookup("cuda_mma", key, mma.MmaConfig) == mma.MmaConfig(1, 1, 1, 3, False, 4, 8)
    assert tuning.preferred(tuning.key(1, 4096, 4096, 64, torch.bfloat16), "choice_mma") == "cuda_gemv"  # shipped


def test_a_tuned_choice_that_cannot_run_here_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped table was measured on an H200: where it names cuda_wgmma and this GPU has no wgmma (or the
    kernel is switched off), the rules decide, instead of every other kernel deferring to the absent one."""
    from trit.kernels import tuning
    from trit.kernels.cuda import launch

    monkeypatch.setattr(launch, "unavailable", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    pin_tables(monkeypatch, {"choice_mma": {}})
    problems = [registry.Problem(m, 4096, 4096, 64, "cuda", torch.bfloat16, layout="mma") for m in (16, 64)]
    for p in problems:
        tuning.prefer(tuning.key(p.m, p.n, p.k, p.group_size, p.dtype), "cuda_wgmma", "choice_mma")

    def first(p: registry.Problem) -> str:
        return next(k.name for k in registry.CUDA if k.name not in registry.disabled() and k.refuse(p) is None)

    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: None)  # Hopper: the table's choice
    assert [first(p) for p in problems] == ["cuda_wgmma", "cuda_wgmma"]
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: "wgmma needs sm_90 (Hopper); this GPU is sm_80")
    assert [first(p) for p in problems] == ["cuda_mma", "cuda_mma"]  # not dequantize + cuBLAS
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: None)
    registry.disable("cuda_wgmma")
    try:
        assert [first(p) for p in problems] == ["cuda_mma", "cuda_mma"]
    finally:
        registry.disable()
