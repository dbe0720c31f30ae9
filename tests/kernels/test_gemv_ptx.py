"""The GEMV's inline PTX, run on the CPU by a small emulator of the instructions it uses.

The CPU interpreter cannot run PTX, so the GPU path's decode constants, masks
and lane order would otherwise be checked only on a GPU. Here the very
strings the kernel compiles (``gemv.WORD_PTX``, ``gemv.PAIR_PTX``) are
executed instruction by instruction, with PTX's semantics (fp16 FMA rounded
once, ``cvt.rn.f16x2.f32 d, a, b`` putting ``a`` in the upper half), on
packed words made by :func:`trit.format.pack`, against the exact dot product.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from trit import format as fmt  # noqa: E402
from trit.kernels import gemv  # noqa: E402

MASK32 = 0xFFFFFFFF


def _f16_bits(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint16).astype(np.uint64)


def _halves(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = (r & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = ((r >> 16) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    return lo, hi


def _join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two float64 arrays rounded once to fp16, as the halves of 32-bit registers."""
    return _f16_bits(lo) | (_f16_bits(hi) << 16)


def run_ptx(ptx: str, args: list[np.ndarray]) -> np.ndarray:
    """Execute ``ptx`` with ``$1..`` = ``args`` (uint64 bit patterns, or float64 for f32 operands); ``$0`` out."""
    regs: dict[str, np.ndarray] = {f"${i + 1}": a for i, a in enumerate(args)}

    def val(tok: str) -> np.ndarray | int:
        return int(tok, 16) if tok.startswith("0x") else int(tok) if tok.isdigit() else regs[tok]

    for line in ptx.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        unpack = re.fullmatch(r"\{(\w+), (\w+)\}, (\w+)", rest)  # mov.b32 {lo, hi}, r: a register's halves
        ops = [t.strip() for t in rest.split(",")]
        if op == "mov.b32" and unpack:
            regs[unpack.group(1)], regs[unpack.group(2)] = _halves(np.asarray(regs[unpack.group(3)]))
        elif op == "mov.b32":
            regs[ops[0]] = np.uint64(val(ops[1]))
        elif op == "shr.u32":
            regs[ops[0]] = (val(ops[1]) & MASK32) >> val(ops[2])
        elif op == "lop3.b32":
            assert int(ops[4], 16) == 0xEA, "the emulator knows (a & b) | c only"
            regs[ops[0]] = (val(ops[1]) & val(ops[2])) | val(ops[3])
        elif op in ("fma.rn.f16x2", "mul.rn.f16x2"):
            a, b = _halves(np.asarray(val(ops[1]))), _halves(np.asarray(val(ops[2])))
            c = _halves(np.asarray(val(ops[3]))) if op.startswith("fma") else (0.0, 0.0)
            regs[ops[0]] = _join(a[0] * b[0] + c[0], a[1] * b[1] + c[1])  # fp16 operands: exact in float64
        elif op == "cvt.f32.f16":
            regs[ops[0]] = regs[ops[1]]
        elif op == "cvt.rn.f16x2.f32":
            regs[ops[0]] = _join(val(ops[2]), val(ops[1]))  # d = (hi: a, lo: b)
        elif op == "add.f32":
            regs[ops[0]] = (val(ops[1]).astype(np.float32) + val(ops[2]).astype(np.float32)).astype(np.float64)
        else:
            raise AssertionError(f"the emulator does not know: {line}")
    return regs["$0"]


@pytest.mark.parametrize("magnitude", [1.0, 3e3, 1e-2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_word_ptx_is_the_dot_product_of_a_words_codes(magnitude: float, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    n = 4096
    codes = torch.from_numpy(rng.integers(-1, 2, (n, 16)).astype(np.int8))
    words = fmt.pack(codes).view(torch.int32).numpy().astype(np.int64).reshape(n) & MASK32  # one word a row
    x = (rng.standard_normal((n, 16)) * magnitude).astype(np.float32)
    shift = gemv.X_SHIFT[dtype]
    xs = x * 2.0 ** -shift  # as the kernel scales them on the way in
    pairs = [run_ptx(gemv.PAIR_PTX.value, [xs[:, j].astype(np.float64), xs[:, j + 8].astype(np.float64)])
             for j in range(8)]
    got = run_ptx(gemv.WORD_PTX.value, [words.astype(np.uint64), *pairs]) * 2.0 ** shift
    want = (codes.numpy().astype(np.float64) * x).sum(1)
    tol = np.abs(x).sum(1) * 2.0 ** -10  # fp16 rounding of the inputs and of eight partial sums
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)
    # the decode is exact: with activations that fp16 holds exactly, so is the dot product
    xi = rng.integers(-64, 65, (n, 16)).astype(np.float32)
    pairs = [run_ptx(gemv.PAIR_PTX.value, [xi[:, j].astype(np.float64), xi[:, j + 8].astype(np.float64)])
             for j in range(8)]
    got = run_ptx(gemv.WORD_PTX.value, [words.astype(np.uint64), *pairs])
    assert np.array_equal(got, (codes.numpy().astype(np.float64) * xi).sum(1))
