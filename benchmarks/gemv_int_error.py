"""How far the GPU GEMV's integer arithmetic lands from the exact dot product, by activation magnitude.

    PYTHONPATH=src python benchmarks/gemv_int_error.py --out benchmarks/results/gemv_int_error_cpu.json

Models the kernel's step on the CPU: activations N(0, magnitude^2) rounded to
bf16 or fp16, in steps of 32 words (512 activations), each step rounded to
integers of ``XB`` bits against its largest activation with the kernel's
power-of-two rule; the words' sums come from the kernel's own PTX
(``gemv.WORD_PTX``, ``gemv.PACK_PTX``) run by the emulator of
``tests/kernels/test_gemv_ptx.py``. Reports the relative RMS error of K = 4096
dot products against float64, plain and with one activation in 512 made 100
times larger (an outlier channel; skipped where that overflows fp16). For scale: rounding a result to
bf16 costs about 2**-9 / sqrt(3) (1.1e-3) relative RMS, to fp16 about
2**-12 / sqrt(3) (1.4e-4).
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

from test_gemv_ptx import word_sums  # noqa: E402

from trit.kernels.triton import gemv  # noqa: E402

MAGNITUDES = (1e-4, 1e-2, 1.0, 1e2, 1e4)
K_WORDS = 256  # K = 4096
STEP_WORDS = 32


def integers(x: np.ndarray, xb: int) -> tuple[np.ndarray, np.ndarray]:
    """A step's activations (rows of 512) as the kernel rounds them: ``xi`` and ``inv`` (x ~= xi * inv)."""
    amax = np.abs(x).max(1, keepdims=True).astype(np.float32)
    eb = np.maximum((amax.view(np.int32) >> 23) & 0xFF, xb)
    s = ((xb + 253 - eb) << 23).astype(np.int32).view(np.float32)
    inv = ((eb + 1 - xb) << 23).astype(np.int32).view(np.float32)
    return np.rint(x * s).astype(np.int64), inv.astype(np.float64)


def dot_error(dtype: torch.dtype, magnitude: float, outlier: bool, dots: int = 40, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    steps = dots * K_WORDS // STEP_WORDS
    codes = rng.integers(-1, 2, (steps * STEP_WORDS, 16)).astype(np.int8)
    x = rng.standard_normal((steps, STEP_WORDS * 16)) * magnitude
    if outlier:
        x[:, 7] *= 100
    x = torch.from_numpy(x.astype(np.float32)).to(dtype).float().numpy()
    xi, inv = integers(x, gemv.XB.value)
    t = word_sums(torch.from_numpy(codes), xi.reshape(-1, 16)).reshape(steps, STEP_WORDS).sum(1)
    got = (t - 64 * xi.sum(1)) * inv[:, 0] / 64
    want = (codes.reshape(steps, -1).astype(np.float64) * x).sum(1)
    got, want = got.reshape(dots, -1).sum(1), want.reshape(dots, -1).sum(1)
    return float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for outlier in (False, True):
            for mag in MAGNITUDES:
                if mag * (100 if outlier else 1) * 5 > torch.finfo(dtype).max:
                    continue
                rows.append({"dtype": str(dtype).removeprefix("torch."), "outlier": outlier, "magnitude": mag,
                             "relative_rms_error": dot_error(dtype, mag, outlier)})
                print(rows[-1], flush=True)
    if a.out:
        a.out.write_text(json.dumps({"command": " ".join(sys.argv), "k": K_WORDS * 16, "x_bits": gemv.XB.value,
                                     "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
