"""Ternary matmul kernels.

``reference`` is the plain-PyTorch oracle and the CPU path; the Triton kernels
(``gemv`` for decode, ``gemm`` for prefill) run on CUDA. Triton is optional:
:func:`triton_candidates` returns none when it is missing.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_candidates() -> tuple:
    """The Triton kernels, fastest first, as :class:`trit.ops.Kernel` entries (empty without triton)."""
    return ()
