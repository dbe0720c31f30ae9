"""A pytest plugin that routes ``trit.kernels.gemv.gemv`` on CUDA tensors to a variant file (``$GEMV_VARIANT``), so
that the shipped GEMV tests check the variant against the reference:

    cd tests && GEMV_VARIANT=../benchmarks/results/gemv-variants/gluon_gemv.py \\
        PYTHONPATH=../src:../benchmarks/results/gemv-variants python3 -m pytest -p route_gemv \\
        kernels/test_triton.py -k test_gemv
"""

import importlib.util
import os
import sys

from trit.kernels import gemv as _shipped

_spec = importlib.util.spec_from_file_location("gemv_variant", os.environ["GEMV_VARIANT"])
variant = importlib.util.module_from_spec(_spec)
sys.modules["gemv_variant"] = variant
_spec.loader.exec_module(variant)
_gemv = _shipped.gemv


def gemv(x, words, scale, group_size, bias=None, config=None):
    if x.is_cuda:
        return variant.gemv(x, words, scale, group_size, bias, config)
    return _gemv(x, words, scale, group_size, bias, config)


_shipped.gemv = gemv
