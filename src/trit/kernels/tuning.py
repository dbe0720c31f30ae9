"""Kernel configs by problem: tables shipped with the package, an on-disk cache, and a small tuner.

A config is looked up by ``(kernel, M bucket, N, K, group, dtype)``, and so is
the kernel the table found fastest for that problem (``choice``). The
package ships tables for common shapes (``kernels/tuned/*.json``, written by
``trit bench kernels``): one tuned on an H200, read on every GPU, and tables
tuned on other GPUs, each read after it on a GPU of its family; a problem that
misses gets the kernel's heuristic default at once, so the first call never
waits. With ``TRIT_AUTOTUNE=1`` a miss is tuned instead (a few dozen configs,
each timed with ``triton.testing.do_bench``, outside CUDA graph capture) and the
winner is kept in ``$TRIT_CACHE/tuned-<GPU name>.json`` for the next process on
that GPU (merged under a file lock; a damaged file is set aside as ``.bad``, with a warning). Times are
CUDA graph replays, so that the host's launch overhead does not hide the
device time of few-microsecond kernels.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch

from trit.cache import cache_dir, write_atomic

C = TypeVar("C")
log = logging.getLogger(__name__)
SHIPPED = Path(__file__).parent / "tuned"
DEFAULT_TABLE = "h200.json"  # read on every GPU; a table tuned on this GPU's family is read after it
_LOCK = threading.Lock()
_TABLES: dict[str, dict[str, dict[str, Any]]] | None = None
_TABLES_DEVICE: str | None = None  # the GPU whose shipped tables _TABLES holds (None: the default table only)
_GENERATION = 0  # bumped whenever a kernel choice may have changed: choices remembered before are stale


def m_bucket(m: int) -> int:
    """1..4 exactly (the GEMV unrolls M), then powers of two up to 4096."""
    if m <= 4:
        return m
    b = 8
    while b < m and b < 4096:
        b *= 2
    return b


def key(m: int, n: int, k: int, group_size: int, dtype: torch.dtype) -> str:
    return f"{m_bucket(m)},{n},{k},{group_size},{str(dtype).removeprefix('torch.')}"


def cache_file(device: str | None) -> Path | None:
    """``$TRIT_CACHE/tuned-<device>.json``: what ``TRIT_AUTOTUNE=1`` tuned on this exact GPU, kept apart from
    other GPUs' (a home directory shared by a cluster's nodes), so a config that fits one GPU's shared memory is
    never tried on another; ``None`` before this process uses a GPU."""
    if device is None:
        return None
    return cache_dir() / f"tuned-{re.sub(r'[^A-Za-z0-9]+', '-', device).strip('-')}.json"


def family(device: str) -> str:
    """The GPU model a shipped table is read on. A model word (capitals then digits, a capital after them:
    ``H100``, ``A100``, ``L40S``, ``GH200``), up to a dash, names every variant of that model: ``H100`` of
    ``NVIDIA H100 80GB HBM3``, ``NVIDIA H100 PCIe`` and ``NVIDIA H100 NVL``, ``A100`` of
    ``NVIDIA A100-SXM4-80GB``. A name without one (``NVIDIA GeForce RTX 4090``, ``Quadro RTX 6000``, whose bare
    numbers recur across generations) is its own family: only a table tuned on that exact name is read on it."""
    for word in device.split():
        head = word.split("-")[0]
        if re.fullmatch(r"[A-Z]{1,3}\d+[A-Z]?", head):
            return head
    return device


def _device_name() -> str | None:
    """The current GPU's name where this process already uses CUDA, else ``None``: picking a table never starts
    CUDA itself (a CPU-only run, or a forked worker whose parent holds a context, must not)."""
    try:
        if torch.cuda.is_initialized():  # a flag: cheap on every lookup until a GPU is found
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except RuntimeError:
        pass
    return None


def _device() -> str | None:
    """This process's GPU: the one its tables were read for, else asked for (until it has one)."""
    return _TABLES_DEVICE if _TABLES_DEVICE is not None else _device_name()


def shipped_tables(device: str | None) -> list[Path]:
    """The shipped tables a process on ``device`` reads, in order, each later one overriding the earlier ones:
    :data:`DEFAULT_TABLE` (tuned on an H200) for every GPU, then the tables tuned on a GPU of the same
    :func:`family` (their ``device`` field; ``h100.json`` on any H100), one tuned on this exact device last. A
    shipped table of another GPU is not read, so its choices never stand in for measurements on this one."""
    default = SHIPPED / DEFAULT_TABLE
    if device is None:
        return [default]
    same, exact = [], []
    for path in sorted(SHIPPED.glob("*.json")):
        tuned_on = json.loads(path.read_text()).get("device", "")
        if path != default and family(tuned_on) == family(device):
            (exact if tuned_on == device else same).append(path)
    return [default, *same, *exact]


def _tables() -> dict[str, dict[str, dict[str, Any]]]:
    """The tables as this process reads them: the shipped ones for its GPU, then what autotuning kept for this
    exact GPU (:func:`cache_file`). Read again, from the files, if this process has begun to use
    CUDA since they were read without a device (what ``prefer`` and ``remember`` recorded in memory before
    then is dropped: ``trit bench kernels`` records only after it has started CUDA)."""
    global _TABLES, _TABLES_DEVICE
    with _LOCK:
        device = _device()
        if _TABLES is None or (device is not None and device != _TABLES_DEVICE):
            if _TABLES is not None:
                _bump()  # read again for this GPU: choices made from the default table are stale
            tables: dict[str, dict[str, dict[str, Any]]] = {}
            cache = cache_file(device)
            for path in [*shipped_tables(device), cache]:
                if path is not None and path.is_file():
                    data = json.loads(path.read_text()) if path != cache else (_read_cache(path) or {})
                    for kernel, entries in data.get("configs", {}).items():
                        tables.setdefault(kernel, {}).update(entries)
                    for table in ("choice", "choice_mma"):  # format v1's kernels; the mma layout's
                        tables.setdefault(table, {}).update(data.get(table, {}))
            _TABLES, _TABLES_DEVICE = tables, device
        return _TABLES


def lookup(kernel: str, problem_key: str, config_type: type[C]) -> C | None:
    """The config kept for ``kernel`` on this problem, or ``None``: also where the entry's fields do not fit
    ``config_type`` (a cache an older version tuned), which is said once, dropped and left to the kernel's
    default. (A field that kept its name but changed its meaning is not caught.)"""
    entries = _tables().get(kernel, {})
    entry = entries.get(problem_key)
    if entry is None:
        return None
    try:
        return config_type(**entry)
    except TypeError as e:
        _warn_once(f"trit: the tuned config of {kernel} for {problem_key} ({entry}) does not fit this version "
                   f"({e}); its default config is used")
        with _LOCK:
            entries.pop(problem_key, None)
        return None


def _read_cache(path: Path) -> dict[str, Any] | None:
    """What autotuning kept at ``path`` (:func:`cache_file`): ``{}`` where there is no file, ``None`` where the
    file cannot be read or is not such a cache (edited by hand, another tool's, a later version's), which is
    said once: a damaged cache costs the configs it held, never a run."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _warn_once(f"trit: {path} is not a readable tuning cache ({e}); its configs are ignored")
        return None
    ok = isinstance(data, dict) and all(isinstance(data.get(part, {}), dict) for part in ("configs", "choice",
                                                                                         "choice_mma"))
    ok = ok and all(isinstance(entries, dict) and all(isinstance(c, dict) for c in entries.values())
                    for entries in data.get("configs", {}).values())
    ok = ok and all(isinstance(name, str) for part in ("choice", "choice_mma") for name in data.get(part, {}).values())
    if not ok:
        _warn_once(f"trit: {path} is not a tuning cache (expected {{\"configs\": {{kernel: {{problem: config}}}}}}); "
                   "its configs are ignored")
        return None
    return data


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``<path>.lock`` (POSIX ``flock``) so that processes tuning at once on one GPU
    (a server's workers, two jobs sharing a home directory) each merge their configs into what the others wrote
    rather than over it. The lock file stays (removing it would race a waiting process). Where it cannot be
    taken (no ``fcntl``, a file system without locks, another user's lock file) the merge goes on unlocked, as
    it did before there was a lock, and that is said once."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only is enough for flock
    except OSError as e:
        _warn_once(f"trit: cannot open {lock} ({e}); tuned configs are merged without a lock")
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # ENOLCK, ENOSYS: a file system without locks
            _warn_once(f"trit: cannot lock {lock} ({e}); tuned configs are merged without a lock")
        yield
    finally:
        os.close(fd)  # releases the lock


def preferred(problem_key: str, table: str = "choice") -> str | None:
    """The kernel the tuned table found fastest for this problem, if it holds one (``table``: ``"choice"`` for
    format v1's kernels, ``"choice_mma"`` for the mma layout's)."""
    return _tables().get(table, {}).get(problem_key)


def prefer(problem_key: str, kernel: str, table: str = "choice") -> None:
    """Record (in memory) the fastest kernel for a problem: ``trit bench kernels`` writes these."""
    tables = _tables()  # loaded first: a record made before the tables are read would be lost
    with _LOCK:
        tables.setdefault(table, {})[problem_key] = kernel
        _bump()


def remember(kernel: str, problem_key: str, config: Any, persist: bool = True) -> None:
    tables = _tables()  # as in prefer
    with _LOCK:
        tables.setdefault(kernel, {})[problem_key] = asdict(config)
        _bump()  # launches planned with the config before are stale (trit.kernels.cuda.launch keeps them)
    device = _device()
    path = cache_file(device) if persist else None
    if path is not None:
        try:
            _persist(path, device, kernel, problem_key, asdict(config))
        except OSError as e:  # a read-only or full cache: the config still serves this process
            _warn_once(f"trit: cannot keep tuned configs in {path} ({e}); they last this process only")


def _persist(path: Path, device: str, kernel: str, problem_key: str, entry: dict) -> None:
    """Merge one config into the cache file, under its lock; a file that is not a cache is kept beside it as
    ``<name>.bad`` and a new one started, so nothing a user may want is overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):  # read, merge and write as one step among processes
        on_disk = _read_cache(path)
        if on_disk is None:
            path.replace(path.with_name(path.name + ".bad"))
            _warn_once(f"trit: {path} kept as {path.name}.bad; a new tuning cache starts")
        on_disk = on_disk or {"device": device, "configs": {}}
        on_disk.setdefault("configs", {}).setdefault(kernel, {})[problem_key] = entry
        write_atomic(path, json.dumps(on_disk, indent=1, sort_keys=True))


def graph_time_us(calls: Sequence[Callable[[], object]], reps: int = 10) -> float:
    """Median over replays of a CUDA graph that makes every call once, per call, in microseconds."""
    times = graph_times_us(calls, reps)
    return times[len(times) // 2]


def graph_times_us(calls: Sequence[Callable[[], object]], reps: int = 10) -> list[float]:
    """Every replay's time (sorted) of a CUDA graph that makes every call once, per call, in microseconds.

    A graph removes the host's launch overhead, which would otherwise hide the
    device time of kernels that run for a few microseconds.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # warm-up outside the graph: compiles and allocates
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)


def tune(make_calls: Callable[[C], Sequence[Callable[[], object]]], candidates: Sequence[C]) -> tuple[C, float]:
    """The fastest candidate and its time (us a call, CUDA graph replays of ``make_calls(cfg)``).

    Candidates that fail to compile or run (too much shared memory, ...) are skipped.
    """
    best, best_us = None, float("inf")
    for cfg in candidates:
        try:
            us = graph_time_us(make_calls(cfg), reps=5)
        except Exception:
            torch.cuda.synchronize()
            continue
        if us < best_us:
            best, best_us = cfg, us
    if best is None:
        raise RuntimeError("no candidate config ran")
    return best, best_us


def autotune_enabled() -> bool:
    return os.environ.get("TRIT_AUTOTUNE") == "1" and not torch.cuda.is_current_stream_capturing()


def reset() -> None:
    """Forget the loaded tables (tests, and after writing a new shipped table)."""
    global _TABLES, _TABLES_DEVICE
    with _LOCK:
        _TABLES, _TABLES_DEVICE = None, None
        _bump()


def _bump() -> None:
    global _GENERATION
    _GENERATION += 1


# the kernels switched off (``TRIT_DISABLE_KERNELS``, ``registry.disable``): kept here, below the kernels, so that
# a kernel's refusal can pass over a tuned choice that names a switched-off kernel
_DISABLED: frozenset[str] = frozenset(n.strip() for n in os.environ.get("TRIT_DISABLE_KERNELS", "").split(",")
                                      if n.strip())


def disabled() -> frozenset[str]:
    return _DISABLED


def set_disabled(names: frozenset[str]) -> None:
    """Use :func:`trit.kernels.registry.disable`, which checks the names."""
    global _DISABLED
    _DISABLED = frozenset(names)


def generation() -> int:
    """How many times the tables changed in this process: part of the key kernel choices are remembered under."""
    return _GENERATION
