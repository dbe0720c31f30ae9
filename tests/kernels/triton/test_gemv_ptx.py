"""The GEMV's inline PTX, run on the CPU by a small emulator of the instructions it uses.

The CPU interpreter cannot run PTX, so the GPU path's masks, byte and lane
order would otherwise be checked only on a GPU. Here the very strings the
kernel compiles (``gemv.WORD_PTX``, ``gemv.PACK_PTX``) are executed
instruction by instruction, with PTX's semantics (``dp2a`` signed 16-bit
times unsigned 8-bit, ``prmt`` selecting bytes), on packed words made by
:func:`trit.format.pack`, against the exact integer dot product.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from trit import format as fmt  # noqa: E402
from trit.kernels.triton import gemv  # noqa: E402

MASK32 = 0xFFFFFFFF
MAGIC = 12582912.0  # gemv.MAGIC: x + MAGIC holds round(x) in its low mantissa bits


def _s16(v: np.ndarray) -> np.ndarray:
    v = v & 0xFFFF
    return np.where(v >= 0x8000, v - 0x10000, v)


def _s32(v: np.ndarray) -> np.ndarray:
    v = v & MASK32
    return np.where(v >= 0x80000000, v - (1 << 32), v)


def _dp2a(a: np.ndarray, b: np.ndarray, c: np.ndarray | int, half: int) -> np.ndarray:
    """``dp2a.{lo,hi}.s32.u32``: two signed 16-bit halves of a times two unsigned bytes of b, plus c."""
    b0, b1 = (b >> (16 * half)) & 0xFF, (b >> (16 * half + 8)) & 0xFF
    return (_s32(np.asarray(c, dtype=np.int64)) + _s16(a) * b0 + _s16(a >> 16) * b1) & MASK32


def run_ptx(ptx: str, args: list[np.ndarray]) -> np.ndarray:
    """Execute ``ptx`` with ``$1..`` = ``args`` (int64 arrays of 32-bit patterns); ``$0`` out, as a pattern."""
    regs: dict[str, np.ndarray] = {f"${i + 1}": np.asarray(a, dtype=np.int64) & MASK32 for i, a in enumerate(args)}

    def val(tok: str) -> np.ndarray | int:
        return int(tok, 16) if tok.startswith("0x") else int(tok) if tok.isdigit() else regs[tok]

    for line in ptx.split("\n"):
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        ops = [t.strip() for t in rest.split(",")]
        if op == "and.b32":
            regs[ops[0]] = val(ops[1]) & val(ops[2])
        elif op in ("dp2a.lo.s32.u32", "dp2a.hi.s32.u32"):
            regs[ops[0]] = _dp2a(val(ops[1]), val(ops[2]), val(ops[3]), 0 if ".lo." in op else 1)
        elif op == "shl.b32":
            regs[ops[0]] = (val(ops[1]) << val(ops[2])) & MASK32
        elif op == "add.s32":
            regs[ops[0]] = (val(ops[1]) + val(ops[2])) & MASK32
        elif op == "prmt.b32":
            assert int(ops[3], 16) == 0x5410, "the emulator knows the low halves' join only"
            regs[ops[0]] = (val(ops[1]) & 0xFFFF) | ((val(ops[2]) & 0xFFFF) << 16)
        else:
            raise AssertionError(f"the emulator does not know: {line}")
    return regs["$0"]


def magic_bits(xi: np.ndarray) -> np.ndarray:
    """What the kernel hands ``PACK_PTX``: the bits of the f32 ``xi + MAGIC`` (``xi`` in its low 16 bits)."""
    return (xi.astype(np.float32) + np.float32(MAGIC)).view(np.int32).astype(np.int64)


def word_sums(codes: torch.Tensor, xi: np.ndarray) -> np.ndarray:
    """Run the kernel's PTX on one word a row: ``64 * sum(c * xi)`` with c = code + 1, as signed int64."""
    words = fmt.pack(codes).view(torch.int32).numpy().astype(np.int64).reshape(-1)
    b = magic_bits(xi)
    order = [(0, 4), (8, 12), (1, 5), (9, 13), (2, 6), (10, 14), (3, 7), (11, 15)]  # gemv._int_dot's pairs
    pairs = [run_ptx(gemv.PACK_PTX.value, [b[:, i], b[:, j]]) for i, j in order]
    return _s32(run_ptx(gemv.WORD_PTX.value, [words, *pairs]))


@pytest.mark.parametrize("bits", [4, 14])
def test_word_ptx_is_the_dot_product_of_a_words_codes(bits: int) -> None:
    rng = np.random.default_rng(bits)
    n = 4096
    codes = torch.from_numpy(rng.integers(-1, 2, (n, 16)).astype(np.int8))
    xi = rng.integers(-(2**bits), 2**bits + 1, (n, 16))
    want = 64 * ((codes.numpy().astype(np.int64) + 1) * xi).sum(1)
    assert np.array_equal(word_sums(codes, xi), want)


def test_word_ptx_at_the_extremes() -> None:
    """All codes +1 (c = 2) against the largest and smallest activations the kernel makes (+-2**XB)."""
    codes = torch.ones(2, 16, dtype=torch.int8)
    big = 2**gemv.XB.value
    assert word_sums(codes, np.array([[big] * 16, [-big] * 16])).tolist() == [64 * 2 * 16 * big, -64 * 2 * 16 * big]


def test_int_sums_stay_in_int32() -> None:
    """The kernel adds INT_WORDS words' sums in int32: the largest (all c = 2, all xi = 2**XB) must fit."""
    assert gemv.XB.value <= 14  # an int16 holds +-2**14
    assert gemv.INT_WORDS.value * 64 * 2 * 16 * 2**gemv.XB.value < 2**31
