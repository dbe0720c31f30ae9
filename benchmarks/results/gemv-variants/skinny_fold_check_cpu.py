"""The skinny GEMM with the group scale folded into the decode (``skinny_fold_fma.patch``) against the shipped one,
under the CPU interpreter: relative error against the exact fp32 product, with unit and with random scales.

    cp src/trit/kernels/skinny.py /tmp/skinny_fold.py && patch /tmp/skinny_fold.py < $V/skinny_fold_fma.patch
    TRITON_INTERPRET=1 PYTHONPATH=src python3 $V/skinny_fold_check_cpu.py /tmp/skinny_fold.py --out $V/skinny_fold_check_cpu.json

The folded kernel rounds each scale to bf16 (the decoded weight ``c * s`` must be exact in bf16), so it is compared
with the exact product of those rounded scales; the shipped one with the exact product of its fp16 scales.
"""

import argparse
import importlib.util
import json
import sys

import torch

from trit.bench.kernels import ternary_layer
from trit.kernels import skinny
from trit.kernels.reference import dequantize


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variant")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("skinny_fold", a.variant)
    fold = importlib.util.module_from_spec(spec)
    sys.modules["skinny_fold"] = fold  # dataclasses look their module up
    spec.loader.exec_module(fold)
    torch.manual_seed(0)
    m, n, k, g = 16, 64, 512, 64
    packed, scale = ternary_layer(n, k, g, device="cpu")
    x = torch.randn(m, k, dtype=torch.bfloat16)
    rows = []
    for kind, sc in (("unit", torch.ones_like(scale)), ("random", scale)):
        for name, mod, used in (("shipped", skinny, sc), ("fold", fold, sc.to(torch.bfloat16).half())):
            y = mod.skinny(x, packed.view(torch.int32), sc, g, None, mod.SkinnyConfig(64, 64, 1, 4, 2, 1)).float()
            exact = x.float() @ dequantize(packed, used, g, k, torch.float32).T
            err = ((y - exact).norm() / exact.norm()).item()
            rows.append({"scales": kind, "kernel": name, "relative_error": err})
            print(kind, name, f"{err:.2e}")
    with open(a.out, "w") as f:
        json.dump({"command": sys.argv, "m": m, "n": n, "k": k, "group": g, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
