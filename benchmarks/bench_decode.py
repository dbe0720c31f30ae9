"""Whole-model decode benchmark on one GPU: ``python benchmarks/bench_decode.py`` (the same as ``trit bench decode``).

See :mod:`trit.bench.decode` for what is measured and how. The committed results, their commands and their
caveats are in ``benchmarks/results/decode/`` and ``benchmarks/results/README.md``.
"""

from __future__ import annotations

import sys

from trit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "decode", *sys.argv[1:]]))
