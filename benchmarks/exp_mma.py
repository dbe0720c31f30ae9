"""Experiment: the CUDA C++ kernels on the load-time mma layout against the shipped kernels and bf16 cuBLAS.

    PYTHONPATH=src python benchmarks/exp_mma.py --out $OUT/mma.json [--ms 1,2,4,16,64,256]

Checks the kernels against the reference on odd shapes first (every group size,
M = 1 to 300, split-K on and off), then times them per layer shape with a small
search over their configs, in CUDA-graph replays with the weights rotated over
copies several times the L2, beside the shipped dispatch and bf16 ``F.linear``
in the same run: the GEMV (``gemv.cu``) for M <= 4, the tensor-core GEMM
(``mma.cu``) for M <= 256, the dequantizer and cuBLAS from M = 16.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

import trit.ops  # noqa: F401  (registers torch.ops.trit.linear)
from trit import format as fmt
from trit.bench.kernels import GROUP, SHAPES, copies_for, ternary_bytes, ternary_layer
from trit.kernels import tuning
from trit.kernels.cuda import gemv, mma, nvrtc
from trit.kernels.reference import linear as ref_linear
from trit.kernels.triton.device import sm_count
from trit.synthetic import random_packed


def check(rows: list) -> float:
    worst = 0.0
    for (m, n, k, g, cfg) in [(3, 34, 128, 64, mma.MmaConfig(1, 1, 1)), (17, 64, 576, 64, mma.MmaConfig(2, 2, 2)),
                              (5, 33, 192, -1, mma.MmaConfig(1, 2, 1)), (64, 130, 256, 32, mma.MmaConfig(2, 1, 2, 3, False)),
                              (1, 1000, 4096, 128, mma.MmaConfig(2, 2, 4)), (2, 77, 2048, 64, mma.MmaConfig(1, 1, 2)),
                              (4, 300, 1536, 32, mma.MmaConfig(2, 1, 1)), (64, 4098, 576, 64, mma.MmaConfig(1, 1, 3, 4, False)),
                              (16, 200, 640, 64, mma.MmaConfig(4, 4, 1, 3)), (40, 96, 1024, -1, mma.MmaConfig(2, 1, 8, 5, True, 8)),
                              (100, 300, 1536, 64, mma.MmaConfig(1, 1, 1, 3, False, 4, 8)),
                              (300, 130, 640, 32, mma.MmaConfig(2, 2, 2, 3, False, 8, 4))]:
        kp = fmt.padded_k(k, g)
        packed = random_packed((n, kp // 4), "cuda")
        scale = (torch.rand(n, fmt.num_groups(g, kp), device="cuda") * 0.02 + 0.005).half()
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        r = mma.repack(packed, scale, g, k)
        want = ref_linear(x, packed, scale, g).float()
        for _rep in range(2):  # twice: the split-K workspace must be zero again after a call
            y = mma.linear(x, r, cfg).float()
        err = float((y - want).norm() / want.norm())
        dense = mma.unpack_layout(r).to(torch.bfloat16)
        yd = torch.nn.functional.linear(x, dense).float()
        derr = float((yd - want).norm() / want.norm())
        rows.append({"check": [m, n, k, g, asdict(cfg)], "rel_err": err, "bf16_dense_rel_err": derr})
        print("check", m, n, k, g, cfg, f"err {err:.5f} (bf16 dense {derr:.5f})", flush=True)
        worst = max(worst, err / max(derr, 1e-6))
        if m <= gemv.MAX_M:
            for gcfg in (gemv.GemvConfig(1, 1), gemv.GemvConfig(2, 3, 8, 2)):
                for _rep in range(2):
                    y = gemv.linear(x, r, gcfg).float()
                gerr = float((y - want).norm() / want.norm())
                rows.append({"check": [m, n, k, g, asdict(gcfg)], "kernel": "gemv", "rel_err": gerr,
                             "bf16_dense_rel_err": derr})
                print("check gemv", m, n, k, g, gcfg, f"err {gerr:.5f}", flush=True)
                worst = max(worst, gerr / max(derr, 1e-6))
        deq_ok = torch.equal(gemv.dequantize(r).float(), dense.float())
        rows.append({"check": [m, n, k, g], "kernel": "dequantize", "exact": deq_ok})
        worst = worst if deq_ok else float("inf")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ms", default="1,2,4,16,64,256")
    ap.add_argument("--models", default="llama3-8b,qwen2-1.5b")
    ap.add_argument("--no-tune", action="store_true", help="the heuristic config only")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    print("nvrtc:", nvrtc.nvrtc()._name, flush=True)
    out = {"command": "PYTHONPATH=src python benchmarks/exp_mma.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v not in (False, None)),
        "device": torch.cuda.get_device_name(), "checks": [], "rows": []}
    out["worst_err_ratio"] = check(out["checks"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.empty(2, 1 << 28, dtype=torch.uint8, device="cuda")
    copy_us = tuning.graph_time_us([lambda: buf[1].copy_(buf[0])])
    out["copy_gbs"] = 2 * buf[0].numel() / copy_us / 1e3
    buf = None
    for model in args.models.split(","):
        for layer, n, k in SHAPES[model]:
            t_bytes = ternary_bytes(n, k)
            copies = copies_for(t_bytes, l2)
            layers = [ternary_layer(n, k) for _ in range(copies)]
            t = time.time()
            reps = [mma.repack(p, s, GROUP, k) for p, s in layers]
            torch.cuda.synchronize()
            repack_ms = (time.time() - t) * 1e3 / copies
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
            for m in (int(v) for v in args.ms.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                row = {"model": model, "layer": layer, "n": n, "k": k, "m": m, "repack_ms": repack_ms}
                row["bf16_us"] = tuning.graph_time_us(
                    [lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in weights])
                row["shipped_us"] = tuning.graph_time_us(
                    [lambda p=p, s=s, x=x: torch.ops.trit.linear(x, p, s, GROUP, None) for p, s in layers])
                want = ref_linear(x, layers[0][0], layers[0][1], GROUP).float()
                best_us = float("inf")
                if m <= gemv.MAX_M:
                    gheur = gemv.heuristic(m, reps[0].row_tiles, reps[0].k_steps, sm_count())
                    row["gemv_heuristic_us"] = tuning.graph_time_us(
                        [lambda r=r, x=x, c=gheur: gemv.linear(x, r, c) for r in reps])
                    row["gemv_heuristic_config"] = asdict(gheur)
                    gbest, gus = (gheur, row["gemv_heuristic_us"]) if args.no_tune else tuning.tune(
                        lambda c, x=x, reps=reps: [lambda r=r: gemv.linear(x, r, c) for r in reps], gemv.configs_for(reps[0], sm_count()))
                    row["gemv_us"], row["gemv_config"] = gus, asdict(gbest)
                    y = gemv.linear(x, reps[0], gbest).float()
                    row["gemv_rel_err"] = float((y - want).norm() / want.norm())
                    best_us = min(best_us, gus)
                if m <= mma.TUNE_MAX_M:
                    heur = mma.heuristic(m, reps[0].row_tiles, reps[0].k_steps, sm_count())
                    row["mma_heuristic_us"] = tuning.graph_time_us(
                        [lambda r=r, x=x, c=heur: mma.linear(x, r, c) for r in reps])
                    row["mma_heuristic_config"] = asdict(heur)
                    if args.no_tune:
                        best, us = heur, row["mma_heuristic_us"]
                    else:
                        best, us = tuning.tune(
                            lambda c, x=x, reps=reps: [lambda r=r: mma.linear(x, r, c) for r in reps], mma.configs_for(m, reps[0], sm_count()))
                    row["mma_us"], row["mma_config"] = us, asdict(best)
                    y = mma.linear(x, reps[0], best).float()
                    row["rel_err"] = float((y - want).norm() / want.norm())
                    best_us = min(best_us, us)
                if m >= 16:
                    row["dequant_cublas_us"] = tuning.graph_time_us(
                        [lambda r=r, x=x: torch.nn.functional.linear(x, gemv.dequantize(r)) for r in reps])
                    best_us = min(best_us, row["dequant_cublas_us"])
                row["layout_us"] = best_us
                row["layout_gbs"] = t_bytes / best_us / 1e3
                row["speedup_layout"] = row["bf16_us"] / best_us
                row["speedup_shipped"] = row["bf16_us"] / row["shipped_us"]
                out["rows"].append(row)
                print(f"{model} {layer} M={m}: bf16 {row['bf16_us']:.1f} shipped {row['shipped_us']:.1f} "
                      f"gemv {row.get('gemv_us', 0):.1f} mma {row.get('mma_us', 0):.1f} "
                      f"dequant {row.get('dequant_cublas_us', 0):.1f}: x{row['speedup_layout']:.2f} vs "
                      f"x{row['speedup_shipped']:.2f} {row['layout_gbs']:.0f} GB/s {row.get('gemv_config')} "
                      f"{row.get('mma_config')}", flush=True)
                args.out.write_text(json.dumps(out, indent=1))
            weights = layers = reps = []
            torch.cuda.empty_cache()
    for model in args.models.split(","):
        for m in (int(v) for v in args.ms.split(",")):
            sel = [r for r in out["rows"] if r["model"] == model and r["m"] == m]
            b = sum(r["bf16_us"] for r in sel)
            line = (f"{model} M={m}: layout x{b / sum(r['layout_us'] for r in sel):.2f} "
                    f"shipped x{b / sum(r['shipped_us'] for r in sel):.2f}")
            out.setdefault("summary", []).append(line)
            print(line)
    out["seconds"] = time.time() - t0
    args.out.write_text(json.dumps(out, indent=1))
    print(f"copy {out['copy_gbs']:.0f} GB/s; {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
