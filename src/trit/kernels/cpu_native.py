"""The native CPU kernel: ``cpu_native.cpp``, compiled at first use, cached, with a reason when it cannot be had.

It reads the packed codes directly (no unpacked copy of the weight), rounds
each token's activations to int16 (int8 by BitNet's rule for W1.58A8) and
takes the dot products in AVX2 integer multiply-adds, rows shared among
torch's threads (the C++ file's header says how). It is built with ``torch.utils.cpp_extension`` (g++ and ninja: a pip
install brings ninja, g++ is the system's) into
``$TRIT_CACHE/cpu_native/<source hash>-<torch version>``, once; when that
fails, :func:`refuse` says why and the op falls back to the ``cpu_words``
path, logging the reason once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time

import torch

from trit import format as fmt
from trit.cache import cache_dir

log = logging.getLogger(__name__)
SOURCE = __file__.removesuffix(".py") + ".cpp"
BUILD_WAIT_S = 600.0  # seconds to wait for another process building the same extension
STALE_LOCK_S = 180.0  # torch's lock file older than this, with no trit builder alive, is a killed build's
MAX_M = 16  # rows of activations; above, dequantize + one float matmul takes over (cpu_words)
_LOCK = threading.Lock()
_STATE: dict = {}  # "module" once built, or "error" once failed


def build_dir():
    """Where the extension is built: ``$TRIT_CACHE/cpu_native/<source hash>-torch<version>``."""
    from pathlib import Path

    digest = hashlib.sha256(Path(SOURCE).read_bytes()).hexdigest()[:12]
    return cache_dir() / "cpu_native" / f"{digest}-torch{torch.__version__.split('+')[0]}"


def _build():
    from torch.utils.cpp_extension import load

    build = build_dir()
    build.mkdir(parents=True, exist_ok=True)
    with _build_lock(build):
        return load(name="trit_cpu_native", sources=[SOURCE], extra_cflags=["-O3"], build_directory=str(build),
                    verbose=False)


@contextlib.contextmanager
def _build_lock(build, timeout: float = BUILD_WAIT_S, stale_after: float = STALE_LOCK_S):
    """One builder at a time across processes, by an OS lock that dies with its holder.

    torch's own lock is a file that a builder removes when it finishes: a builder killed halfway (SIGKILL from
    a timeout, the OOM killer) leaves it behind, and every later ``load`` of that folder waits on it forever.
    Holding this lock, no other trit process on this machine is building, so a ``lock`` file found in the
    folder is such a leftover; it is removed once it is ``stale_after`` seconds old (until then it may be a
    killed builder's compiler still finishing, or a builder on another machine sharing the cache), and the
    wait for it counts against ``timeout``. Waiting longer than ``timeout`` raises (the op then falls back).
    Where the file system refuses the lock (some NFS mounts, a cache folder of another user's), the build goes
    on without it, as torch's alone would."""
    import fcntl

    deadline = time.monotonic() + timeout
    fh = None
    try:
        fh = open(build / "trit-build.lock", "a+")  # noqa: SIM115  (held across the yield, closed below)
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building {build} for over {timeout:.0f} s") from None
                time.sleep(0.2)
    except TimeoutError:
        fh.close()
        raise
    except OSError as e:
        if fh is not None:
            fh.close()
            fh = None
        log.warning("trit: no build lock in %s (%s); building without it", build, e)
    if fh is None:
        yield
        return
    try:
        stale = build / "lock"
        while stale.exists():
            try:
                age = time.time() - stale.stat().st_mtime
            except FileNotFoundError:
                break
            if age >= stale_after:
                log.warning("trit: removing %s, left by a build that did not finish", stale)
                stale.unlink(missing_ok=True)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{stale} has been held for over {timeout:.0f} s")
            time.sleep(0.2)
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def module():
    """The compiled extension, built on first use; None (and :func:`build_error` says why) if it cannot be."""
    with _LOCK:
        if "module" not in _STATE and "error" not in _STATE:
            try:
                mod = _build()
                if mod.isa() == "none":
                    raise RuntimeError("this CPU has no AVX2 (with FMA and F16C)")
                _STATE["module"] = mod
            except Exception as e:  # noqa: BLE001  (any build or load failure: fall back, say why once)
                _STATE["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else e}"
                log.warning("trit: the native CPU kernel is not available (%s); using the cpu_words path",
                            _STATE["error"])
        return _STATE.get("module")


def build_error() -> str | None:
    return _STATE.get("error")


def supports_group(group_size: int) -> bool:
    return group_size == fmt.PER_ROW or (group_size >= 32 and group_size & (group_size - 1) == 0)


def refuse(k_pad: int, group_size: int, dtype: torch.dtype) -> str | None:
    if dtype not in (torch.float32, torch.bfloat16):
        return f"activations are {str(dtype).removeprefix('torch.')}; it takes float32 or bf16"
    if k_pad % 64:
        return f"K_pad = {k_pad} is not a multiple of 64 (one 16-byte chunk of codes)"
    if not supports_group(group_size):
        return f"group size {group_size} is not a power of two >= 32"
    if module() is None:
        return f"not built: {build_error()}"
    return None


def rule(m: int) -> str | None:
    """Decode sizes only: above :data:`MAX_M` rows dequantizing once and one float matmul is faster."""
    return f"M = {m} > {MAX_M}: dequantize + one float matmul is faster there" if m > MAX_M else None


def _run(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int, bias, int8: bool):
    x2 = x.reshape(-1, x.shape[-1]).float().contiguous()  # (M, K)
    group = fmt.group_width(group_size, packed.shape[1] * fmt.CODES_PER_BYTE)
    y = module().linear(x2, packed.contiguous(), scale.contiguous(), group, int8)  # (M, N) f32
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], packed.shape[0])


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:  # (..., K) -> (..., N)
    """Activations rounded to int16 per token and 64-input chunk (error about 2**-16 of the chunk's largest)."""
    return _run(x, packed, scale, group_size, bias, int8=False)


def linear_a8(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """W1.58A8: activations rounded to int8 per token by BitNet's rule, as :func:`trit.kernels.reference.linear_a8`."""
    return _run(x, packed, scale, group_size, bias, int8=True)
