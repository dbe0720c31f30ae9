"""The NVRTC loader's disk cache (``trit/kernels/cuda/nvrtc.py``), with the compiler replaced by a stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from trit.kernels import pdl
from trit.kernels.cuda import nvrtc


def test_precompile_fills_the_cache_once_for_each_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    monkeypatch.setattr(nvrtc, "_arch", lambda suffix="": "sm_90" + suffix)
    calls = []

    def fake_compile(source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> tuple[bytes, str, str]:
        calls.append((name, arch, options))
        if name == "bad":
            raise nvrtc.CudaUnavailable("NVRTC could not compile bad")
        return b"cubin of " + name.encode(), f"lowered_{name}", ""

    monkeypatch.setattr(nvrtc, "compile_cubin", fake_compile)
    failed = nvrtc.precompile("source", ["k<1>", "k<2>", "k<1>", "bad"], ("-DX",), arch_suffix="a", threads=2)
    assert failed == {"bad": "NVRTC could not compile bad"}  # reported, and the others still compiled
    calls.remove(("bad", "sm_90a", ("-DX",)))
    assert sorted(calls) == [("k<1>", "sm_90a", ("-DX",)), ("k<2>", "sm_90a", ("-DX",))]
    nvrtc.precompile("source", ["k<1>", "k<2>"], ("-DX",), arch_suffix="a")  # cached: nothing compiled again
    assert len(calls) == 2
    path = nvrtc._cubin_path("source", "k<2>", "sm_90a", ("-DX",))
    assert path.read_bytes() == b"cubin of k<2>" and path.with_suffix(".name").read_text() == "lowered_k<2>"
    assert nvrtc._cubin_path("source", "k<2>", "sm_90", ("-DX",)) != path  # the target is part of the key
    assert not list(tmp_path.rglob("*.tmp-*"))
    path.with_suffix(".name").unlink()  # a cubin without its lowered name is compiled again
    nvrtc.precompile("source", ["k<2>"], ("-DX",), arch_suffix="a")
    assert calls[-1] == ("k<2>", "sm_90a", ("-DX",)) and len(calls) == 3


def test_the_launch_structs_have_the_driver_apis_layout() -> None:
    """``CUlaunchConfig`` and ``CUlaunchAttribute`` as cuda.h lays them out: the sizes and offsets a C program
    built against CUDA 13.0's cuda.h printed (sizeof, offsetof), written here as numbers."""
    import ctypes

    assert ctypes.sizeof(nvrtc.LaunchConfig) == 56
    assert (nvrtc.LaunchConfig.stream.offset, nvrtc.LaunchConfig.attrs.offset, nvrtc.LaunchConfig.num_attrs.offset) \
        == (32, 40, 48)
    assert ctypes.sizeof(nvrtc.LaunchAttribute) == 72 and nvrtc.LaunchAttribute.value.offset == 8
    assert ctypes.alignment(nvrtc.LaunchAttribute) == 8


def test_a_pdl_launch_asks_for_programmatic_stream_serialization() -> None:
    import ctypes

    attr = nvrtc.LaunchAttribute()
    cfg = nvrtc.pdl_config((7, 2, 3), 128, 4096, 0x1234, attr)
    assert (list(cfg.grid), list(cfg.block), cfg.shared_mem_bytes, cfg.stream) == ([7, 2, 3], [128, 1, 1], 4096, 0x1234)
    assert cfg.num_attrs == 1 and ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attr)
    assert attr.id == 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    value = bytes(attr)[8:]
    assert int.from_bytes(value[:4], "little") == 1 and not any(value[4:])


def test_pdl_is_asked_for_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, wanted in (("", False), ("0", False), ("1", True), (" 1 ", True)):
        monkeypatch.setenv(pdl.ENV, text)
        assert pdl.wanted() is wanted
    monkeypatch.delenv(pdl.ENV)
    assert pdl.wanted() is False
    monkeypatch.setenv(pdl.ENV, "yes")
    with pytest.raises(ValueError, match="TRIT_PDL='yes': expected 1"):
        pdl.wanted()


def test_triton_kernels_on_the_cpu_never_ask_for_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from trit.kernels.triton import device

    monkeypatch.setenv(pdl.ENV, "1")
    assert device.pdl_kwargs(torch.zeros(2)) == {}  # not a CUDA tensor: the kernel's plain launch
