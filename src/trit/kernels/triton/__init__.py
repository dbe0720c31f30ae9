"""The Triton kernels (NVIDIA GPUs), one file a kernel family, and :mod:`.launch`, which says what each accepts.

``gemm_a8`` (int8 activations on int8 tensor cores, BitNet's W1.58A8 prefill),
``gemv`` (decode, M <= 4, CUDA cores), ``skinny`` (decode batches, M <= 64,
weights on the tensor cores' wide side), ``gemm`` (tensor cores, decoding in
registers) and ``dequant`` (a dense copy for cuBLAS, long prefills); ``codes``
turns packed words into numbers for all of them, ``splitk`` and ``schedule``
are shared launch helpers. Triton is optional: :func:`available` says whether
it is installed, and nothing here is imported without it.
"""

from __future__ import annotations

import importlib.util


def available() -> bool:
    return importlib.util.find_spec("triton") is not None
