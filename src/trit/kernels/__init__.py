"""Ternary matmul kernels.

``reference`` is the plain-PyTorch oracle; ``cpu`` the CPU path; on CUDA the
Triton kernels: ``gemm_a8`` (int8 activations on int8 tensor cores, BitNet's
W1.58A8 prefill), ``gemv`` (decode, M <= 4, CUDA cores), ``skinny`` (decode
batches, M <= 64, weights on the tensor cores' wide side), ``gemm`` (tensor cores,
decoding in registers) and ``dequant`` (a dense copy for cuBLAS, long
prefills). Triton is optional: :func:`triton_candidates` returns none without it.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_candidates() -> tuple:
    """The Triton kernels, in the order :func:`trit.ops.choose_kernel` tries them (empty without triton)."""
    if not triton_available():
        return ()
    from trit.kernels import cuda
    from trit.ops import Kernel

    return (
        Kernel("triton_gemm_a8", cuda.refuse_gemm_a8, None, cuda.run_gemm_a8),
        Kernel("triton_gemv", cuda.refuse_gemv, cuda.run_gemv),
        Kernel("triton_skinny", cuda.refuse_skinny, cuda.run_skinny),
        Kernel("triton_gemm", cuda.refuse_gemm, cuda.run_gemm),
        Kernel("triton_dequant_cublas", cuda.refuse_dequant, cuda.run_dequant),
    )
