"""CUDA C++ kernels compiled at first use with NVRTC and launched through the driver API.

No compiler for the user to bring: NVRTC is a library that CUDA builds of torch
already depend on (``nvidia-cuda-nvrtc``). A compiled kernel's binary is kept
in ``$TRIT_CACHE/cuda/`` under a hash of its source, name, options and GPU
architecture. Launches go on torch's current stream, so CUDA graphs capture
them like any other kernel. Everything here talks to the two C libraries
through ``ctypes``; any failure raises :class:`CudaUnavailable` with the
reason, and callers fall back to the Triton kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from trit.cache import cache_dir, write_atomic


class CudaUnavailable(RuntimeError):
    """NVRTC or the CUDA driver could not compile, load or launch a kernel; the message says why."""


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _nvrtc_candidates() -> list[str]:
    names = [os.environ["TRIT_NVRTC"]] if os.environ.get("TRIT_NVRTC") else []
    for site in _site_dirs():
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"):
            d = site / sub
            if d.is_dir():
                names += sorted(str(p) for p in d.glob("libnvrtc.so.*") if "builtins" not in p.name)
    return names + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


_NVRTC: ctypes.CDLL | None = None


def nvrtc() -> ctypes.CDLL:
    """The NVRTC library, found beside the installed Python packages or on the loader's path."""
    global _NVRTC
    if _NVRTC is None:
        tried = []
        for name in _nvrtc_candidates():
            try:
                _NVRTC = ctypes.CDLL(name)
                break
            except OSError as e:
                tried.append(f"{name} ({e})")
        else:
            raise CudaUnavailable("NVRTC not found; tried " + ", ".join(tried[-3:]))
    return _NVRTC


def version() -> tuple[int, int]:
    """NVRTC's (major, minor); raises :class:`CudaUnavailable` where it is not installed."""
    lib = nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _nvrtc_check(code: int, what: str) -> None:
    if code != 0:
        lib = nvrtc()
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CudaUnavailable(f"NVRTC {what}: {lib.nvrtcGetErrorString(code).decode()}")


def compile_cubin(source: str, name: str, arch: str, options: tuple[str, ...] = ()) -> tuple[bytes, str, str]:
    """Compile ``source`` for ``arch`` (e.g. ``"sm_90"``) and return (cubin, lowered name of ``name``, log).

    ``name`` may be a template instantiation such as ``"kern<2, 64>"``.
    """
    lib = nvrtc()
    prog = ctypes.c_void_p()
    _nvrtc_check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"trit.cu", 0, None, None), "create")
    try:
        _nvrtc_check(lib.nvrtcAddNameExpression(prog, name.encode()), "name")
        opts = [f"--gpu-architecture={arch}", "-std=c++17", *options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if res != 0:
            raise CudaUnavailable(f"NVRTC could not compile {name} for {arch}:\n{log}")
        _nvrtc_check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _nvrtc_check(lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        lowered = ctypes.c_char_p()
        _nvrtc_check(lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(lowered)), "lowered name")
        return cubin.raw, lowered.value.decode(), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


_DRIVER: ctypes.CDLL | None = None


def driver() -> ctypes.CDLL:
    global _DRIVER
    if _DRIVER is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaUnavailable(f"the CUDA driver (libcuda.so.1) could not be loaded: {e}") from e
        # declared once, so that a launch passes plain ints (ctypes converts them without a Python object each)
        u = ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p]
        lib.cuLaunchKernel.restype = ctypes.c_int
        _DRIVER = lib
    return _DRIVER


def _cu_check(code: int, what: str) -> None:
    if code != 0:
        s = ctypes.c_char_p()
        driver().cuGetErrorString(code, ctypes.byref(s))
        raise CudaUnavailable(f"CUDA driver {what}: {s.value.decode() if s.value else code}")


@functools.cache
def param_layout(signature: str) -> tuple[struct.Struct, tuple[int, ...]]:
    """A kernel's parameters as one buffer: ``signature`` gives each parameter's type in :mod:`struct`'s codes
    (``P`` a pointer, ``i`` an int, ``f`` a float), in order; each sits at its natural alignment, as the
    compiler lays out a ``__global__`` function's parameters. Returns the packer and each parameter's offset."""
    offsets = tuple(struct.calcsize("@" + signature[: i + 1]) - struct.calcsize("@" + c)
                    for i, c in enumerate(signature))
    return struct.Struct("@" + signature), offsets


_PARAMS = threading.local()  # each thread's buffer and pointer array, one a signature


def pack_params(signature: str, values: tuple) -> tuple[ctypes.Array, ctypes.Array]:
    """The parameter buffer and the ``void**`` array of pointers into it that ``cuLaunchKernel`` reads, filled with
    ``values`` by one ``struct`` pack. Both are this thread's, kept for the signature and overwritten by its next
    launch: the driver copies the parameters when the launch is made. (A ctypes object a parameter, as before,
    cost about 20 us of host time a launch of 13 parameters.)"""
    kept = _PARAMS.__dict__
    entry = kept.get(signature)
    if entry is None:
        packer, offsets = param_layout(signature)
        buf = ctypes.create_string_buffer(packer.size)
        base = ctypes.addressof(buf)
        entry = kept[signature] = (packer, buf, (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets]))
    packer, buf, params = entry
    packer.pack_into(buf, 0, *values)
    return buf, params


@functools.cache
def _raw_stream():
    """``f(device) -> the current stream's handle``, an int."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher calls: an int, no object
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


@dataclass
class Kernel:
    """A loaded kernel: ``launch(grid, block, smem, signature, values)`` on torch's current stream of its GPU."""

    name: str
    module: ctypes.c_void_p
    func: ctypes.c_void_p
    device: int = 0  # the GPU it was loaded on
    smem_limit: int = 48 * 1024  # dynamic shared memory a launch may ask for (raised by ``allow_smem``)

    def allow_smem(self, smem: int) -> None:
        """Let launches use ``smem`` bytes of dynamic shared memory (above the default 48 KiB: an opt-in)."""
        if smem > self.smem_limit:
            _cu_check(driver().cuFuncSetAttribute(self.func, 8, smem), f"shared memory of {self.name}")
            self.smem_limit = smem  # 8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

    def launch(self, grid: tuple[int, int, int], block: int, smem: int, signature: str, values: tuple) -> None:
        """Launch with the parameters ``values``, of the types ``signature`` (:func:`param_layout`)."""
        _, params = pack_params(signature, values)
        code = driver().cuLaunchKernel(self.func.value, grid[0], grid[1], grid[2], block, 1, 1, smem,
                                       _raw_stream()(self.device), params, None)
        if code != 0:
            _cu_check(code, f"launch of {self.name}")


_LOADED: dict[tuple[str, str, str, tuple[str, ...], int], Kernel] = {}  # (source, name, arch suffix, options, GPU)


def _arch(arch_suffix: str = "") -> str:
    import torch

    return _device_arch(torch.cuda.current_device(), arch_suffix)


@functools.cache
def _device_arch(device: int, arch_suffix: str) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}{arch_suffix}"


def _cubin_path(source: str, name: str, arch: str, options: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\0".join([source, name, arch, *options]).encode()).hexdigest()[:24]
    return cache_dir() / "cuda" / f"{digest}.cubin"


def _compile_to_cache(source: str, name: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    path = _cubin_path(source, name, arch, options)
    lowered_path = path.with_suffix(".name")
    if path.exists() and lowered_path.exists():
        return path.read_bytes(), lowered_path.read_text()
    cubin, lowered, _ = compile_cubin(source, name, arch, options)
    write_atomic(path, cubin)
    write_atomic(lowered_path, lowered)
    return cubin, lowered


def precompile(source: str, names: list[str], options: tuple[str, ...] = (), arch_suffix: str = "",
               threads: int | None = None) -> dict[str, str]:
    """Compile the kernels ``names`` of ``source`` for the current GPU into the disk cache, several at once
    (NVRTC runs outside the GIL), so that tuning over many configs does not wait for each in turn. Returns the
    names that failed, with NVRTC's message: a warm-up, so a failure is left for the kernel's own load to
    raise (tuning passes over a config that cannot run)."""
    from concurrent.futures import ThreadPoolExecutor

    arch = _arch(arch_suffix)
    todo = sorted({n for n in names if not (_cubin_path(source, n, arch, options).exists()
                                            and _cubin_path(source, n, arch, options).with_suffix(".name").exists())})

    def one(name: str) -> str | None:
        try:
            _compile_to_cache(source, name, arch, options)
        except CudaUnavailable as e:
            return str(e)
        return None

    if not todo:
        return {}
    with ThreadPoolExecutor(threads or min(16, os.cpu_count() or 1)) as pool:
        return {n: why for n, why in zip(todo, pool.map(one, todo), strict=True) if why is not None}


def load(source: str, name: str, options: tuple[str, ...] = (), smem: int = 0, arch_suffix: str = "") -> Kernel:
    """Compile (or take from the disk cache) and load ``name`` for the current GPU (``arch_suffix`` "a": its
    architecture-specific target, as ``wgmma`` needs: ``sm_90a``)."""
    import torch

    dev = torch.cuda.current_device()
    kern = _LOADED.get((source, name, arch_suffix, options, dev))
    if kern is not None:
        kern.allow_smem(smem)
        return kern
    arch = _device_arch(dev, arch_suffix)
    cubin, lowered = _compile_to_cache(source, name, arch, options)
    torch.cuda.init()
    torch.empty(1, device="cuda")  # a current context
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    _cu_check(driver().cuModuleLoadData(ctypes.byref(module), cubin), f"load of {name}")
    _cu_check(driver().cuModuleGetFunction(ctypes.byref(func), module, lowered.encode()), f"lookup of {name}")
    kern = Kernel(name, module, func, dev)
    kern.allow_smem(smem)
    _LOADED[(source, name, arch_suffix, options, dev)] = kern
    return kern
