"""The NVRTC loader's disk cache (``trit/kernels/cuda/nvrtc.py``), with the compiler replaced by a stand-in."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from trit.kernels.cuda import launch, nvrtc


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


def test_parameters_sit_at_their_natural_alignment() -> None:
    _, offsets = nvrtc.param_layout("PPPiiiii")  # trit_dequant's
    assert offsets == (0, 8, 16, 24, 28, 32, 36, 40)
    packer, offsets = nvrtc.param_layout("iPif")  # a pointer after an int starts on the next 8 bytes
    assert offsets == (0, 8, 16, 20) and packer.size == 24


def test_each_parameter_pointer_reads_back_its_value() -> None:
    values = (0x7F00_1234_5678, 0xDEAD_BEEF_0000, -3, 2**31 - 1, 1.5)
    buf, params = nvrtc.pack_params("PPiif", values)
    got = [ctypes.cast(params[i], ctypes.POINTER(t)).contents.value
           for i, t in enumerate((ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_float))]
    assert got == list(values)
    assert params[0] == ctypes.addressof(buf)


def test_each_thread_packs_into_a_buffer_of_its_own() -> None:
    """A launch's buffer is kept for the next launch of that signature; another thread's launch must not write
    into it between one thread's pack and its launch."""
    import threading

    mine = ctypes.addressof(nvrtc.pack_params("Pi", (1, 2))[0])
    assert ctypes.addressof(nvrtc.pack_params("Pi", (3, 4))[0]) == mine  # kept, and filled again
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(ctypes.addressof(nvrtc.pack_params("Pi", (5, 6))[0])))
    t.start()
    t.join()
    assert theirs and theirs[0] != mine
    buf, params = nvrtc.pack_params("Pi", (7, 8))
    assert ctypes.cast(params[1], ctypes.POINTER(ctypes.c_int)).contents.value == 8


@pytest.mark.skipif(not torch.cuda.is_available() or launch.unavailable() is not None, reason="needs a GPU and NVRTC")
def test_the_signatures_match_the_compiled_kernels_parameters() -> None:
    """The driver's own account of each kernel's parameters (``cuFuncGetParamInfo``, CUDA 12.4's driver on) against
    the offsets the launches pack them at."""
    from trit.kernels.cuda import gemv, imma, mma, wgmma

    kernels = [(gemv.source(), "trit_dequant", gemv.DEQUANT_SIGNATURE, ""),
               (mma.source(), mma.kernel_name(1, mma.MmaConfig(), 128), mma.SIGNATURE, ""),
               (gemv.source(), gemv.kernel_name(1, gemv.GemvConfig(), 128), mma.SIGNATURE, ""),
               (imma.source(), imma.kernel_name(1, imma.ImmaConfig(), 128), mma.SIGNATURE, "")]
    if wgmma.supported(torch.device("cuda")) is None:
        kernels.append((wgmma.source(), wgmma.kernel_name(wgmma.WgmmaConfig(), 128), mma.SIGNATURE, "a"))
    info = getattr(nvrtc.driver(), "cuFuncGetParamInfo", None)
    if info is None:
        pytest.skip("this driver has no cuFuncGetParamInfo (CUDA 12.4 and later)")
    for source, name, signature, suffix in kernels:
        kern = nvrtc.load(source, name, arch_suffix=suffix)
        packer, offsets = nvrtc.param_layout(signature)
        got = []
        for i in range(len(offsets)):
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            assert info(kern.func, ctypes.c_size_t(i), ctypes.byref(off), ctypes.byref(size)) == 0, (name, i)
            got.append(off.value)
        assert tuple(got) == offsets, name
        assert got[-1] + size.value == packer.size, name  # the last parameter ends where the buffer does
        assert info(kern.func, ctypes.c_size_t(len(offsets)), ctypes.byref(off), ctypes.byref(size)) != 0, name
