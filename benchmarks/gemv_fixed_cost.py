"""How an M = 1 layer's time splits into a fixed part and a part that grows with the bytes read, on one GPU.

    PYTHONPATH=src python3 benchmarks/gemv_fixed_cost.py --out $OUT/gemv_fixed_cost_h200.json

For K = 4096 and N from 1024 to 28672 rows it times, as ``trit bench kernels``
does (CUDA graph replays, weights rotated past the L2), the ``trit::linear`` op
at M = 1 (the GEMV with the shipped table's config, or the default one) and
bf16 ``F.linear``. A least-squares line ``t = a + bytes / b`` through each
kernel's points gives ``a``, the time a call costs however small it is
(launch in the graph, the first loads' latency, the last programs' tail), and
``b``, the bandwidth of the rest, compared with the copy bandwidth measured in
the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

NS = (1024, 2048, 4096, 8192, 12288, 16384, 22528, 28672)
K = 4096


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a in us, b in bytes/s) of ``t = a + bytes / b``, least squares."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, 1e6 / slope


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from trit import ops
    from trit.bench.kernels import GROUP, copies_for, copy_bandwidth, ternary_bytes, ternary_layer
    from trit.kernels import tuning

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy = copy_bandwidth()
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    rows = []
    for n in NS:
        t_bytes = ternary_bytes(n, K) + 2 * (K + n)
        layers = [ternary_layer(n, K) for _ in range(copies_for(t_bytes, l2))]
        trit_us = tuning.graph_time_us([lambda p=p, s=s: ops.linear(x, p, s, GROUP, None) for p, s in layers])
        b_bytes = 2 * n * K + 2 * (K + n)
        weights = [torch.randn(n, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(b_bytes, l2))]
        bf16_us = tuning.graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in weights])
        rows.append({"n": n, "k": K, "m": 1, "kernel": ops.choose_kernel(ops.Problem.of(x, layers[0][0], GROUP, False)).kernel.name, "trit_us": trit_us,
                     "trit_bytes": t_bytes, "bf16_us": bf16_us, "bf16_bytes": b_bytes})
        print(f"N={n}: trit {trit_us:.2f} us ({t_bytes / 1e6:.1f} MB), bf16 {bf16_us:.2f} us", flush=True)
        del layers, weights
    result = {"command": sys.argv, "device": torch.cuda.get_device_name(0), "copy_bandwidth_bytes_per_s": copy,
              "rows": rows}
    for name in ("trit", "bf16"):
        fixed, bw = fit([(r[f"{name}_bytes"], r[f"{name}_us"]) for r in rows])
        result[f"{name}_fixed_us"] = fixed
        result[f"{name}_streaming_bytes_per_s"] = bw
        result[f"{name}_streaming_frac_copy_bw"] = bw / copy
        print(f"{name}: fixed {fixed:.2f} us, then {bw / 1e12:.2f} TB/s ({bw / copy:.0%} of the copy's "
              f"{copy / 1e12:.2f} TB/s)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
