"""The skinny GEMM with the group scale folded into the decode (``skinny_fold_fma.patch``) against the shipped one,
under the CPU interpreter: relative error against the exact fp32 product, with unit and with random scales.

    cp src/trit/kernels/skinny.py /tmp/skinny_fold.py && patch /tmp/skinny_fold.py < $V/skinny_fold_fma.patch
    TRITON_INTERPRET=1 PYTHONPATH=src python3 $V/skinny_fold_check_cpu.py /tmp/skinny_fold.py --out $V/skinny_fold_check_cpu.json

The folded kernel rounds each scale to bf16 (the decoded weight ``c * s`` must be exact in bf16), so it is compared
with the exact product of those rounded scales; the shipped one with the exact product of its fp16 scales.
The interpreter converts float to bf16 toward zero (the GPU rounds to nearest): the script measures that on a
plain store (``interpreter_bf16``) and compares the folded kernel with both roundings of its scales
(``reference_scales``: ``nearest``, as the GPU rounds them, and ``toward_zero``, as the interpreter does).
"""

import argparse
import json
import sys

import torch
import triton
import triton.language as tl
from sweep import load  # this folder's

from trit.bench.kernels import ternary_layer
from trit.kernels import skinny
from trit.kernels.reference import dequantize


@triton.jit
def _to_bf16(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y_ptr + o, tl.load(x_ptr + o).to(tl.bfloat16))


def interpreter_bf16_store(n: int = 4096) -> dict:
    """How the running Triton converts float32 to bf16, against torch's round to nearest and toward zero."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    y = torch.empty(n, dtype=torch.bfloat16)
    _to_bf16[(1,)](x, y, n)
    toward_zero = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return {"values": n, "equal_to_nearest": (y == x.to(torch.bfloat16)).sum().item(),
            "equal_to_toward_zero": (y == toward_zero).sum().item()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variant")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fold = load(a.variant, "skinny_fold")
    torch.manual_seed(0)
    m, n, k, g = 16, 64, 512, 64
    packed, scale = ternary_layer(n, k, g, device="cpu")
    x = torch.randn(m, k, dtype=torch.bfloat16)
    rows = []
    for kind, sc in (("unit", torch.ones_like(scale)), ("random", scale)):
        toward_zero = (sc.float().view(torch.int32) & ~0xFFFF).view(torch.float32)
        for name, mod, rounding, used in (("shipped", skinny, "none (fp16)", sc),
                                          ("fold", fold, "nearest", sc.to(torch.bfloat16).half()),
                                          ("fold", fold, "toward_zero", toward_zero.half())):
            y = mod.skinny(x, packed.view(torch.int32), sc, g, None, mod.SkinnyConfig(64, 64, 1, 4, 2, 1)).float()
            exact = x.float() @ dequantize(packed, used, g, k, torch.float32).T
            err = ((y - exact).norm() / exact.norm()).item()
            rows.append({"scales": kind, "kernel": name, "reference_scales": rounding, "relative_error": err})
            print(kind, name, rounding, f"{err:.2e}")
    with open(a.out, "w") as f:
        json.dump({"command": sys.argv, "m": m, "n": n, "k": k, "group": g,
                   "interpreter_bf16": interpreter_bf16_store(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
