"""The dequantize kernel's configs, alone and in front of cuBLAS at long prefills, on one GPU.

    PYTHONPATH=src python3 benchmarks/sweep_dequant.py --out sweep_dequant.json

For each layer shape of ``trit bench kernels``, in one run: every config of
``trit.kernels.dequant.CONFIGS`` writing the dense bf16 weight (device time,
bytes moved over time, and that as a fraction of the copy bandwidth measured
in the same run), then at each ``--ms`` row count bf16 ``F.linear`` (cuBLAS)
against dequantize + ``F.linear`` with the default config and with the
shape's fastest one. CUDA graph replays; the ternary weights rotate over
copies several times the L2, as in ``trit bench kernels``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from trit.bench.kernels import GROUP, SHAPES, copies_for, copy_bandwidth, ternary_bytes, ternary_layer
from trit.kernels import dequant, tuning


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[2048])
    args = ap.parse_args(argv)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    start = time.time()
    copy_bw = [copy_bandwidth() for _ in range(3)]  # three times, the best counts (on the H200 the three agreed)
    bw = max(copy_bw)
    rows = []
    for model, shapes in SHAPES.items():
        for layer, n, k in shapes:
            t_bytes = ternary_bytes(n, k)
            moved = t_bytes + n * k * 2
            layers = [ternary_layer(n, k) for _ in range(copies_for(t_bytes, l2))]
            dense = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
            times = {cfg: tuning.graph_time_us([
                lambda p=p, s=s, cfg=cfg, dense=dense, k=k: dequant.dequantize(
                    p.view(torch.int32), s, GROUP, k, torch.bfloat16, out=dense, config=cfg)
                for p, s in layers]) for cfg in dequant.CONFIGS}
            row = {"model": model, "layer": layer, "n": n, "k": k,
                   "configs": [{**asdict(cfg), "us": us, "frac_copy_bw": moved / (us * 1e-6) / bw}
                               for cfg, us in times.items()]}
            best_cfg = min(times, key=times.get)
            row["default_us"], row["best_us"], row["best"] = times[dequant.DEFAULT], times[best_cfg], asdict(best_cfg)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
            row["prefill"] = []
            for m in args.ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                bf16 = tuning.graph_time_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in weights])
                timed = {}
                for name, cfg in (("default", dequant.DEFAULT), ("best", best_cfg)):
                    timed[name] = tuning.graph_time_us([
                        lambda p=p, s=s, cfg=cfg, x=x, k=k: torch.nn.functional.linear(
                            x, dequant.dequantize(p.view(torch.int32), s, GROUP, k, x.dtype, config=cfg))
                        for p, s in layers])
                row["prefill"].append({"m": m, "bf16_us": bf16, "default_us": timed["default"],
                                       "best_us": timed["best"]})
            rows.append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
            del layers, weights, dense
            torch.cuda.empty_cache()
    summed = {}
    for model in SHAPES:
        for m in args.ms:
            sel = [p for r in rows if r["model"] == model for p in r["prefill"] if p["m"] == m]
            bf = sum(p["bf16_us"] for p in sel)
            summed[f"{model} M={m}"] = {"default": bf / sum(p["default_us"] for p in sel),
                                        "best": bf / sum(p["best_us"] for p in sel)}
    result = {"command": " ".join(["benchmarks/sweep_dequant.py", *sys.argv[1:]]),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_bandwidth_bytes_per_s": bw, "copy_bandwidth_runs": copy_bw, "l2_bytes": l2,
              "seconds": time.time() - start, "summed_speedup_vs_bf16": summed, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summed, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
