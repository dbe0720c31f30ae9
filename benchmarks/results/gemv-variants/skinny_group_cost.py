"""What the per-group scaling costs the skinny GEMM at M = 16: the same layers with scales a group of 64 and with
one scale a row (group -1, no scaling between steps), each at the best of its shipped search space.

    PYTHONPATH=src python3 benchmarks/results/gemv-variants/skinny_group_cost.py --out $OUT/skinny_group_cost.json
"""

import argparse
import json
import sys

import torch

from trit.bench.kernels import copies_for, ternary_layer
from trit.kernels import skinny, tuning


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for n, k in [(28672, 4096), (4096, 14336), (6144, 4096)]:
        m = 16
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for g in (64, -1):
            layers = [ternary_layer(n, k, g) for _ in range(copies_for(n * k // 4, l2))]
            best = (float("inf"), "")
            for cfg in [None, *skinny.configs_for(m, g)]:
                calls = [lambda p=p, s=s, cfg=cfg, x=x, g=g: skinny.skinny(x, p.view(torch.int32), s, g, None, cfg)
                         for p, s in layers]
                best = min(best, (tuning.graph_time_us(calls, reps=5), str(cfg)))
            print(n, k, m, g, f"{best[0]:.2f} us", best[1], flush=True)
            rows.append({"n": n, "k": k, "m": m, "group": g, "us": best[0], "config": best[1]})
    with open(a.out, "w") as f:
        json.dump({"command": sys.argv, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
