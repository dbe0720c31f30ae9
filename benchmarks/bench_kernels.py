"""Kernel benchmark on one GPU: ``python benchmarks/bench_kernels.py`` (the same as ``trit bench kernels``).

See :mod:`trit.bench.kernels` for what is measured and how. Results land in
``benchmarks/results/kernels.json`` and ``kernels.png``; the tuned config table
in ``src/trit/kernels/tuned/h200.json``.
"""

from __future__ import annotations

import sys

from trit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "kernels", *sys.argv[1:]]))
