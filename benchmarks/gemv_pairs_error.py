"""How far the GPU GEMV's fp16-pair arithmetic lands from the exact dot product, by activation magnitude.

    PYTHONPATH=src python benchmarks/gemv_pairs_error.py --out benchmarks/results/gemv_pairs_error_cpu.json

Runs the kernel's own PTX strings (``gemv.WORD_PTX``, ``gemv.PAIR_PTX``) through
the CPU emulator of ``tests/kernels/test_gemv_ptx.py`` on random codes and
activations N(0, magnitude^2) rounded to bf16 or fp16, and reports the
relative RMS error of the K = 4096 dot products (256 words each) against
float64. For scale: rounding a result to bf16 costs about 2**-9 / sqrt(3)
(1.1e-3) relative RMS, to fp16 about 2**-12 / sqrt(3) (1.4e-4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kernels"))

from test_gemv_ptx import MASK32, run_ptx  # noqa: E402

from trit import format as fmt  # noqa: E402
from trit.kernels import gemv  # noqa: E402

MAGNITUDES = (1e-4, 1e-3, 1e-2, 1.0, 1e2, 1e3)
K_WORDS = 256  # K = 4096


def dot_error(dtype: torch.dtype, magnitude: float, dots: int = 80, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    n = dots * K_WORDS
    codes = torch.from_numpy(rng.integers(-1, 2, (n, 16)).astype(np.int8))
    words = (fmt.pack(codes).view(torch.int32).numpy().astype(np.int64).reshape(n) & MASK32).astype(np.uint64)
    x = torch.from_numpy((rng.standard_normal((n, 16)) * magnitude).astype(np.float32)).to(dtype).float().numpy()
    shift = gemv.X_SHIFT[dtype]
    xs = (x * 2.0**-shift).astype(np.float64)
    pairs = [run_ptx(gemv.PAIR_PTX.value, [xs[:, j], xs[:, j + 8]]) for j in range(8)]
    got = (run_ptx(gemv.WORD_PTX.value, [words, *pairs]) * 2.0**shift).reshape(dots, K_WORDS).sum(1)
    want = (codes.numpy().astype(np.float64) * x).sum(1).reshape(dots, K_WORDS).sum(1)
    return float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for mag in MAGNITUDES:
            rows.append({"dtype": str(dtype).removeprefix("torch."), "magnitude": mag,
                         "x_shift": gemv.X_SHIFT[dtype], "relative_rms_error": dot_error(dtype, mag)})
            print(rows[-1], flush=True)
    if a.out:
        a.out.write_text(json.dumps({"command": " ".join(sys.argv), "k": K_WORDS * 16, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
