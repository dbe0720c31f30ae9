"""The NVRTC loader's disk cache (``trit/kernels/cuda/nvrtc.py``), with the compiler replaced by a stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

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
