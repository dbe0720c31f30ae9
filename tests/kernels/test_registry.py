"""Kernel choice: what each candidate can run, the tuned table or the rule of thumb among those that can, the reasons
every answer gives, and switching a kernel off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from trit import format as fmt
from trit.kernels import registry
from trit.kernels.cuda import mma


def pin_tables(monkeypatch: pytest.MonkeyPatch, tables: dict | None) -> None:
    """Stand ``tables`` (``{"configs": ..., "choice": {layout: {key: kernel}}}``) in for the tuned tables (``None``:
    read from the files, as with no GPU in use: none), with no GPU in use: a test that started CUDA earlier in
    the session must not make them be read again for its GPU."""
    from trit.kernels import tuning

    if tables is not None:
        tables = {"configs": {}, "choice": {}, **tables}
    monkeypatch.setattr(tuning, "_TABLES", tables)
    monkeypatch.setattr(tuning, "_TABLES_DEVICE", None)
    monkeypatch.setattr(tuning, "_device_name", lambda: None)


def test_choose_kernel_explains_refusals() -> None:
    choice = registry.choose_kernel(registry.Problem(1, 64, 96, 12, "cpu", torch.float32))
    assert choice.kernel is registry.REFERENCE
    assert ("cpu_words", "cannot: group size 12 is not a multiple of 16") in choice.refused
    assert ("cuda_gemv", "cannot: reads the mma layout only") in choice.refused
    assert "reference: chosen (the rule of thumb)" in choice.explain()
    assert registry.choose_kernel(registry.Problem(17, 64, 576, 64, "cpu", torch.float32)).kernel is registry.CPU


def test_a_disabled_kernel_is_passed_over_with_its_reason() -> None:
    problem = registry.Problem(17, 64, 576, 64, "cpu", torch.float32)
    try:
        registry.disable("cpu_words")
        choice = registry.choose_kernel(problem)
        assert choice.kernel is registry.REFERENCE
        assert ("cpu_words", "cannot: disabled (TRIT_DISABLE_KERNELS or registry.disable)") in choice.refused
    finally:
        registry.disable()
    assert registry.choose_kernel(problem).kernel is registry.CPU
    with pytest.raises(ValueError, match="registry.disable: no kernel named nope; the kernels are .*cpu_words"):
        registry.disable("nope")
    with pytest.raises(ValueError, match="the reference kernel cannot be switched off"):
        registry.disable("reference")


@pytest.mark.parametrize(("value", "message"), [
    ("cpu_wrods", "TRIT_DISABLE_KERNELS='cpu_wrods': no kernel named cpu_wrods; the kernels are"),
    ("cpu_words,reference", "TRIT_DISABLE_KERNELS='cpu_words,reference': the reference kernel cannot be"),
])
def test_trit_disable_kernels_is_checked_like_disable(monkeypatch: pytest.MonkeyPatch, value: str,
                                                      message: str) -> None:
    monkeypatch.setattr(registry, "_DISABLED", None)  # read from the environment again
    monkeypatch.setenv("TRIT_DISABLE_KERNELS", value)
    with pytest.raises(ValueError, match=message):
        registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.float32))
    monkeypatch.setenv("TRIT_DISABLE_KERNELS", " cpu_words , cpu_native")
    monkeypatch.setattr(registry, "_DISABLED", None)
    assert registry.disabled() == {"cpu_words", "cpu_native"}
    assert registry.choose_kernel(registry.Problem(17, 64, 576, 64, "cpu", torch.float32)).kernel is registry.REFERENCE


def test_the_native_cpu_kernel_takes_decode_sizes_by_rule_and_says_why_not_others() -> None:
    from trit.kernels import cpu_native

    if cpu_native.module() is None:
        pytest.fail(f"the native CPU kernel did not build here: {cpu_native.build_error()}")
    assert registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.float32)).kernel is registry.NATIVE
    refused = dict(registry.choose_kernel(registry.Problem(17, 64, 576, 64, "cpu", torch.float32)).refused)
    assert refused["cpu_native"] == ("can; the rule of thumb (no tuned choice) passes it over: M = 17 > 16: "
                                     "dequantize + one float matmul is faster there")
    refused = dict(registry.choose_kernel(registry.Problem(1, 64, 96, 32, "cpu", torch.float32)).refused)
    assert refused["cpu_native"] == "cannot: K_pad = 96 is not a multiple of 64 (one 16-byte chunk of codes)"


def _on_a_gpu(monkeypatch: pytest.MonkeyPatch, wgmma: str | None) -> None:
    """The CUDA kernels' refusals as on a GPU where NVRTC compiles (no GPU needed); ``wgmma``: its refusal."""
    from trit.kernels.cuda import launch

    monkeypatch.setattr(launch, "unavailable", lambda: None)
    monkeypatch.setattr(launch, "_wgmma_support", lambda dev: wgmma)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from trit.kernels import tuning

    tuning.forget()  # choices worked out for the GPU stood in before


def _mma(m: int, dtype: torch.dtype = torch.bfloat16, act_int8: bool = False) -> registry.Problem:
    return registry.Problem(m, 4096, 4096, 64, "cuda", dtype, act_int8, layout="mma")


def test_the_two_layouts_go_to_their_own_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels.cuda import launch

    v1 = registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.float32))
    assert ("cuda_gemv", "cannot: reads the mma layout only") in v1.refused and not v1.kernel.name.startswith("cuda")
    tiled = registry.choose_kernel(registry.Problem(1, 64, 576, 64, "cpu", torch.bfloat16, layout="mma"))
    assert tiled.kernel is registry.REFERENCE
    assert ("cpu_words", "cannot: reads format v1, not the mma layout") in tiled.refused
    assert ("cuda_gemv", "cannot: runs on CUDA, not cpu") in tiled.refused
    # on a GPU where NVRTC compiles and no tuned table: each size to its kernel by the rule of thumb
    pin_tables(monkeypatch, {})
    _on_a_gpu(monkeypatch, "wgmma needs sm_90 (Hopper); this GPU is sm_89")
    for m, name in ((1, "cuda_gemv"), (launch.GEMV_MAX_M, "cuda_gemv"), (launch.GEMV_MAX_M + 1, "cuda_mma"),
                    (64, "cuda_mma"), (65, "cuda_dequant_cublas"), (4096, "cuda_dequant_cublas")):
        assert registry.choose_kernel(_mma(m)).kernel.name == name, m
    assert registry.choose_kernel(_mma(1)).explain().splitlines()[:2] == [
        "cuda_wgmma_a8: cannot: takes int8 activations (W1.58A8) only",
        "cuda_imma: can; the rule of thumb (no tuned choice) passes it over: it runs where a tuned table measured "
        "it fastest, not by rule"]
    _on_a_gpu(monkeypatch, None)  # an sm_90 GPU: wgmma from 64 to 256 rows
    for m, name in ((launch.GEMV_MAX_M + 1, "cuda_mma"), (63, "cuda_mma"), (64, "cuda_wgmma"), (256, "cuda_wgmma"),
                    (257, "cuda_dequant_cublas")):
        assert registry.choose_kernel(_mma(m)).kernel.name == name, m
    assert all("bf16" in k.refuse(_mma(1, torch.float16)) for k in registry.CUDA)
    # int8 activations (W1.58A8): the GEMV rounds them first at M = 1; from 16 rows the int8 wgmma kernel, on
    # int8 tensor cores, for one scale a row (BitNet's imports) at every M and groups of 64 and 128 up to 64 rows
    assert registry.choose_kernel(_mma(1, act_int8=True)).kernel.name == "cuda_gemv"
    for g in (fmt.PER_ROW, 64, 128):
        a8 = dataclasses.replace(_mma(16, act_int8=True), group_size=g)
        assert registry.choose_kernel(a8).kernel.name == "cuda_wgmma_a8", g
        assert registry.choose_kernel(dataclasses.replace(a8, m=64)).kernel.name == "cuda_wgmma_a8", g
        assert registry.choose_kernel(dataclasses.replace(a8, m=15)).kernel.name == "cuda_mma", g
    row = dataclasses.replace(_mma(2048, act_int8=True), group_size=fmt.PER_ROW)
    assert registry.choose_kernel(row).kernel.name == "cuda_wgmma_a8"
    g64 = dataclasses.replace(row, m=100, group_size=64)
    assert registry.choose_kernel(g64).kernel.name == "cuda_wgmma"
    assert "M = 100 > 64 with groups of 64" in registry.choose_kernel(g64).explain().splitlines()[0]
    # groups of 32 take the kernels that round the activations first
    g32 = dataclasses.replace(_mma(100, act_int8=True), group_size=32)
    assert registry.choose_kernel(g32).kernel.name == "cuda_wgmma"
    assert "groups of 32" in registry.choose_kernel(g32).explain().splitlines()[0]


def test_the_tuned_table_picks_among_the_kernels_that_can(monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.kernels import tuning

    _on_a_gpu(monkeypatch, None)
    pin_tables(monkeypatch, {"choice": {"mma": {}}})

    def chosen(m: int) -> str:
        return registry.choose_kernel(_mma(m)).kernel.name

    assert (chosen(2), chosen(4), chosen(32)) == ("cuda_gemv", "cuda_gemv", "cuda_mma")  # no entry: the rule
    tuning.prefer(_mma(4).key, "cuda_mma", "mma")
    tuning.prefer(_mma(32).key, "cuda_dequant_cublas", "mma")
    assert (chosen(2), chosen(4), chosen(32)) == ("cuda_gemv", "cuda_mma", "cuda_dequant_cublas")
    tuning.prefer(_mma(2).key, "cuda_imma", "mma")
    tuning.prefer(_mma(32).key, "cuda_imma", "mma")
    assert (chosen(2), chosen(4), chosen(32)) == ("cuda_imma", "cuda_mma", "cuda_imma")
    assert tuning.preferred(_mma(4).key, "v1") is None  # format v1's choice apart
    assert registry.choose_kernel(_mma(4, act_int8=True)).kernel.name == "cuda_gemv"  # a W1.58A8 problem is its own
    why = dict(registry.choose_kernel(_mma(4)).refused)["cuda_gemv"]
    assert why == "can; the tuned table of this GPU measured cuda_mma faster"
    tuning.prefer(_mma(100).key, "cuda_mma", "mma")  # the 128 bucket: the mma kernel above 64 rows too
    assert chosen(100) == "cuda_mma" and chosen(300) == "cuda_dequant_cublas"  # the 512 bucket: no entry, the rule


def test_a_choice_recorded_before_the_tables_are_read_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """`trit bench kernels` may tune a problem before anything has read the shipped tables."""
    from trit.kernels import tuning

    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    pin_tables(monkeypatch, None)
    key = tuning.key(100, 4096, 4096, 64, torch.bfloat16)
    tuning.prefer(key, "cuda_mma", "mma")
    tuning.remember("cuda_mma", key, mma.MmaConfig(1, 1, 1, 3, False, 4, 8), persist=False)
    assert tuning.preferred(key, "mma") == "cuda_mma"
    assert tuning.lookup("cuda_mma", key, mma.MmaConfig) == mma.MmaConfig(1, 1, 1, 3, False, 4, 8)
    with pytest.raises(ValueError, match="layout 'choice_mma'"):
        tuning.prefer(key, "cuda_mma", "choice_mma")


def test_a_tuned_choice_that_cannot_run_here_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the table names a kernel this process cannot run (switched off, or no wgmma), the rules decide,
    and the explanation says so."""
    from trit.kernels import tuning

    pin_tables(monkeypatch, {"choice": {"mma": {}}})
    problems = [_mma(16), _mma(64)]
    for p in problems:
        tuning.prefer(p.key, "cuda_wgmma", "mma")
    _on_a_gpu(monkeypatch, None)  # Hopper: the table's choice
    assert [registry.choose_kernel(p).kernel.name for p in problems] == ["cuda_wgmma", "cuda_wgmma"]
    _on_a_gpu(monkeypatch, "wgmma needs sm_90 (Hopper); this GPU is sm_80")
    assert [registry.choose_kernel(p).kernel.name for p in problems] == ["cuda_mma", "cuda_mma"]
    assert registry.choose_kernel(problems[0]).why == "the rule of thumb (cuda_wgmma, the tuned choice, cannot)"
    _on_a_gpu(monkeypatch, None)
    registry.disable("cuda_wgmma")
    try:
        assert [registry.choose_kernel(p).kernel.name for p in problems] == ["cuda_mma", "cuda_mma"]
    finally:
        registry.disable()
