"""Dequantize + cuBLAS in row chunks, through one buffer small enough to stay in L2.

Where a layer goes to dequantize + cuBLAS (prefill, large decode batches) the
one-shot path writes the whole dense weight to memory (``2 N K`` bytes) and
cuBLAS reads it back: for Llama-3-8B's gate_up 235 MB each way, against the 29
MB of codes it started from, and a transient of that size in whatever pool the
call runs in (a CUDA graph's pool keeps it). In chunks, each ``rows x K`` slice
of the weight is dequantized into one reused buffer and multiplied at once
(``y[:, r0:r1]`` written in place, cuBLAS's leading dimension N), so the
buffer's lines can stay in L2 between the write and the read and the transient
is the buffer.

``TRIT_DEQUANT_CHUNK_MB`` sets the buffer's size in MiB; 0 (the default) keeps
the one-shot path: the chunked one is not measured yet.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

ENV = "TRIT_DEQUANT_CHUNK_MB"
DEFAULT_MB = 0


def chunk_bytes() -> int:
    """The buffer's size from ``TRIT_DEQUANT_CHUNK_MB`` (MiB, unset or empty: the default); 0: no chunks."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_MB * 2**20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if mb < 0:
        raise ValueError(f"{ENV}={text!r}: expected a size in MiB, 0 or more (0: dequantize in one piece)")
    return int(mb * 2**20)


def rows_per_chunk(n: int, k: int, itemsize: int, budget: int, align: int = 1) -> int:
    """Rows of a ``(rows, k)`` buffer of ``itemsize`` bytes that fit ``budget`` bytes, a multiple of ``align``
    (at least ``align``); ``n`` (one piece) when the budget is 0 or holds the whole weight."""
    if budget <= 0:
        return n
    rows = max(align, budget // (k * itemsize) // align * align)
    return n if rows >= n else rows


def linear(x: torch.Tensor, n: int, dequant_rows: Callable[[int, int, torch.Tensor | None], torch.Tensor],
           bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``x`` (..., K) times the dense weight (N, K) that ``dequant_rows(r0, r1, out)`` writes a slice of at a
    time (rows ``r0:r1`` into ``out``, or a new tensor when ``out`` is None), plus ``bias``: (..., N).

    ``rows >= n``: one slice, the one-shot path. Each slice's bias is added inside its GEMM (one rounding, as
    ``F.linear`` does)."""
    if rows >= n:
        return torch.nn.functional.linear(x, dequant_rows(0, n, None), bias)
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    buf = torch.empty(rows, x2.shape[1], dtype=x.dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w = dequant_rows(r0, r1, buf[: r1 - r0])
        if bias is None:  # a column slice: cuBLAS writes it with ldc = N, no copy
            torch.mm(x2, w.t(), out=y[:, r0:r1])
        else:
            torch.addmm(bias[r0:r1], x2, w.t(), out=y[:, r0:r1])
    return y.view(*x.shape[:-1], n)
