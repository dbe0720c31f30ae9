"""A pytest plugin that routes ``trit.kernels.gemv.gemv`` on CUDA tensors to a variant file (``$GEMV_VARIANT``), so
that the shipped GEMV tests check the variant against the reference:

    cd tests && GEMV_VARIANT=../benchmarks/results/gemv-variants/gluon_gemv.py \\
        PYTHONPATH=../src:../benchmarks/results/gemv-variants python3 -m pytest -p route_gemv \\
        kernels/test_triton.py -k test_gemv
"""

import os

from sweep import load  # this folder's

from trit.kernels import gemv as _shipped

variant = load(os.environ["GEMV_VARIANT"], "gemv_variant")
_gemv = _shipped.gemv


def gemv(x, words, scale, group_size, bias=None, config=None):
    if x.is_cuda:
        return variant.gemv(x, words, scale, group_size, bias, config)
    return _gemv(x, words, scale, group_size, bias, config)


_shipped.gemv = gemv
