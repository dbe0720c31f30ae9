"""Kernel configs by problem: tables shipped with the package, an on-disk cache, and a small tuner.

A config is looked up by ``(kernel, M bucket, N, K, group, dtype)``, and so is
the kernel the table found fastest for that problem (``choice``, one table a
layout). The package ships tables for common shapes (``kernels/tuned/*.json``,
written by ``trit bench kernels``), each read only on a GPU of the model it was
tuned on (:func:`family`); a GPU without one gets the kernels' rules of thumb
(:mod:`trit.kernels.registry`), and a problem a table misses gets the kernel's
heuristic config at once, so the first call never waits. With ``TRIT_AUTOTUNE=1`` a miss is tuned instead (a few dozen configs,
each timed with ``triton.testing.do_bench``, outside CUDA graph capture) and the
winner is kept in ``$TRIT_CACHE/tuned-<GPU name>.json`` for the next process on
that GPU (merged under a file lock; a damaged file is set aside as ``.bad``, with a warning). Times are
CUDA graph replays, so that the host's launch overhead does not hide the
device time of few-microsecond kernels.

What is worked out from the tables (kernel choices, launch plans, warmed
shapes) is kept in one cache, :func:`memo`, emptied whenever a table changes.
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
LAYOUTS = ("v1", "mma")  # the layouts a choice table is kept for: format v1's kernels, the mma layout's
_LOCK = threading.Lock()
_TABLES: dict[str, dict[str, dict[str, Any]]] | None = None
_TABLES_DEVICE: str | None = None  # the GPU whose shipped tables _TABLES holds (None: no GPU in use yet)
_MEMO: dict[Any, Any] = {}  # what is worked out from the tables; emptied when they change
MEMO_MAX = 8192  # entries kept (a server sees each token count up to its largest batch once a layer shape)


def m_bucket(m: int) -> int:
    """1..4 exactly (the GEMV unrolls M), then powers of two up to 4096."""
    if m <= 4:
        return m
    b = 8
    while b < m and b < 4096:
        b *= 2
    return b


def key(m: int, n: int, k: int, group_size: int, dtype: torch.dtype, act_int8: bool = False) -> str:
    """A problem's entry in the tables; int8 activations (W1.58A8) are a problem of their own (``,a8``)."""
    return f"{m_bucket(m)},{n},{k},{group_size},{str(dtype).removeprefix('torch.')}" + (",a8" if act_int8 else "")


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


def tuned_on() -> str:
    """The GPU whose tables this process reads (for explanations)."""
    return _TABLES_DEVICE or "this GPU"


def shipped_tables(device: str | None) -> list[Path]:
    """The shipped tables a process on ``device`` reads, in order, each later one overriding the earlier ones:
    those tuned on a GPU of the same :func:`family` (their ``device`` field; ``h100.json`` on any H100), one
    tuned on this exact device last. A table of another GPU is never read, so its choices never stand in for
    measurements on this one; no GPU in use, or none of its model: none (the rules of thumb decide)."""
    if device is None:
        return []
    same, exact = [], []
    for path in sorted(SHIPPED.glob("*.json")):
        tuned_on = json.loads(path.read_text()).get("device", "")
        if family(tuned_on) == family(device):
            (exact if tuned_on == device else same).append(path)
    return [*same, *exact]


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
                _MEMO.clear()  # read again for this GPU: what was worked out without its tables is stale
            tables: dict[str, dict[str, dict[str, Any]]] = {"configs": {}, "choice": {}}
            cache = cache_file(device)
            for path in [*shipped_tables(device), cache]:
                if path is not None and path.is_file():
                    data = json.loads(path.read_text()) if path != cache else (_read_cache(path) or {})
                    for kernel, entries in data.get("configs", {}).items():
                        tables["configs"].setdefault(kernel, {}).update(entries)
                    for layout, entries in data.get("choice", {}).items():
                        tables["choice"].setdefault(layout, {}).update(entries)
            _TABLES, _TABLES_DEVICE = tables, device
        return _TABLES


def lookup(kernel: str, problem_key: str, config_type: type[C]) -> C | None:
    """The config kept for ``kernel`` on this problem, or ``None``: also where the entry's fields do not fit
    ``config_type`` (a cache an older version tuned), which is said once, dropped and left to the kernel's
    default. (A field that kept its name but changed its meaning is not caught.)"""
    entries = _tables()["configs"].get(kernel, {})
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


def shipped_lookup(device: str, kernel: str, problem_key: str, config_type: type[C]) -> C | None:
    """The config the tables shipped for ``device`` hold for ``kernel`` on this problem, read from the files
    whatever GPU this process has (``trit bench sass`` compiles kernels as that GPU would specialize them)."""
    entry = None
    for path in shipped_tables(device):
        entry = json.loads(path.read_text()).get("configs", {}).get(kernel, {}).get(problem_key, entry)
    return None if entry is None else config_type(**entry)


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
    ok = isinstance(data, dict) and all(isinstance(data.get(part, {}), dict) for part in ("configs", "choice"))
    ok = ok and all(isinstance(entries, dict) and all(isinstance(c, dict) for c in entries.values())
                    for entries in data.get("configs", {}).values())
    ok = ok and all(isinstance(entries, dict) and all(isinstance(name, str) for name in entries.values())
                    for entries in data.get("choice", {}).values())
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


def preferred(problem_key: str, layout: str) -> str | None:
    """The kernel this GPU's tuned table found fastest for this problem among ``layout``'s kernels (``"v1"``:
    format v1's, ``"mma"``: the mma layout's), if it holds one."""
    return _tables()["choice"].get(layout, {}).get(problem_key)


def prefer(problem_key: str, kernel: str, layout: str) -> None:
    """Record (in memory) the fastest of ``layout``'s kernels for a problem: ``trit bench kernels`` writes these."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    tables = _tables()  # loaded first: a record made before the tables are read would be lost
    with _LOCK:
        tables["choice"].setdefault(layout, {})[problem_key] = kernel
        _MEMO.clear()


def remember(kernel: str, problem_key: str, config: Any, persist: bool = True) -> None:
    tables = _tables()  # as in prefer
    with _LOCK:
        tables["configs"].setdefault(kernel, {})[problem_key] = asdict(config)
        _MEMO.clear()  # launches planned with the config before are stale
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
    """Forget the loaded tables and what was worked out from them (tests, after writing a shipped table)."""
    global _TABLES, _TABLES_DEVICE
    with _LOCK:
        _TABLES, _TABLES_DEVICE = None, None
        _MEMO.clear()


def memo(key: Any, make: Callable[[], C]) -> C:
    """The one cache of what is worked out from the tables (a problem's kernel choice, a launch plan, a warmed
    layer shape): ``make()`` once for ``key``, until the tables change (:func:`prefer`, :func:`remember`,
    :func:`reset`, a GPU found) or :func:`forget`. Bounded: full, it starts again."""
    if _TABLES_DEVICE is None and (_TABLES is None or _device_name() is not None):
        _tables()  # read (or read again for a GPU now in use) before anything is kept from them
    try:
        return _MEMO[key]
    except KeyError:
        pass
    value = make()
    with _LOCK:
        if len(_MEMO) >= MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = value
    return value


def forget() -> None:
    """Empty :func:`memo` (kernels switched on or off)."""
    with _LOCK:
        _MEMO.clear()
