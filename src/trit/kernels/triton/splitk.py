"""Split-K in one launch: programs that share output rows add up their partial sums themselves.

Each program of a split writes its fp32 partial ``[M, BLOCK_N]`` to a
workspace, then takes a ticket on its row block's counter; the program that
draws the last ticket sums the partials, writes the output (bias added, cast to
the output dtype) and sets the counter back to zero for the next call. No
memset and no second kernel, so a split costs nothing extra between launches
(or between the nodes of a CUDA graph). The counters live in one persistent
zeroed buffer per device; calls on one stream never overlap, which is what the
counters assume.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_COUNTERS: dict[torch.device, torch.Tensor] = {}
MAX_BLOCKS = 1 << 16


def counters(device: torch.device) -> torch.Tensor:
    """The device's zeroed int32 ticket counters (made once, before any CUDA graph capture uses them)."""
    buf = _COUNTERS.get(device)
    if buf is None:
        buf = _COUNTERS[device] = torch.zeros(MAX_BLOCKS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def store_or_reduce(
    acc,  # [BLOCK_N] f32: this program's partial sum for activation row m
    y_ptr, ws_ptr, lock_ptr, b_ptr, rows, row_ok, m, M, N,
    pid_n, pid_k,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    M_ROWS: tl.constexpr,
    LAST_ROW: tl.constexpr,  # m == M_ROWS - 1: the ticket is taken after the last row's partial
):
    """Write row ``m`` of the output, or, under split-K, this program's partial of it (see the module)."""
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * N + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)
    else:
        tl.store(ws_ptr + (pid_k * M + m) * N + rows, acc, mask=row_ok)
        if LAST_ROW:
            tl.debug_barrier()  # every thread's partial is written before the ticket is taken
            ticket = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT_K - 1:
                for mm in tl.static_range(M_ROWS):
                    total = tl.load(ws_ptr + mm * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
                    for kk in tl.static_range(1, SPLIT_K):
                        total += tl.load(ws_ptr + (kk * M + mm) * N + rows, mask=row_ok, other=0.0,
                                         cache_modifier=".cg")
                    if HAS_BIAS:
                        total += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
                    tl.store(y_ptr + mm * N + rows, total.to(y_ptr.dtype.element_ty), mask=row_ok)
                tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")


def outputs(x: torch.Tensor, n: int, split_k: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(M, N)`` output (``x``'s rows, device and dtype) and the ``(SPLIT_K, M, N)`` fp32 workspace of the
    partials (the output itself, unused, without a split); more row blocks than counters is an error."""
    if blocks > MAX_BLOCKS:
        raise ValueError(f"{blocks} row blocks > {MAX_BLOCKS} split-K counters")
    m = x.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    ws = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device) if split_k > 1 else y
    return y, ws


@triton.jit
def store_or_reduce_tile(
    acc,  # [BLOCK_M, BLOCK_N] f32: this program's partial
    y_ptr, ws_ptr, lock_ptr, b_ptr, offs_m, offs_n, M, N, lock_id, pid_k,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """:func:`store_or_reduce` for a 2-D output tile (the GEMM)."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    offs = offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs, acc, mask=mask)
        tl.debug_barrier()
        ticket = tl.atomic_add(lock_ptr + lock_id, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for kk in tl.static_range(SPLIT_K):
                total += tl.load(ws_ptr + kk * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + lock_id, 0, sem="relaxed", scope="gpu")
