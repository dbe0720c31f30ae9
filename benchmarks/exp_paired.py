"""Experiment: the paired-layout GEMM against the shipped kernels and bf16 cuBLAS, M = 16 to 256 (H200).

    PYTHONPATH=src python benchmarks/exp_paired.py --out $OUT/paired.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

import trit.ops  # noqa: F401  (registers torch.ops.trit.linear)
from trit.bench.kernels import GROUP, SHAPES, copies_for, ternary_bytes, ternary_layer
from trit.kernels import tuning
from trit.kernels.reference import linear as ref_linear
from trit.kernels.triton import dequant, paired
from trit.kernels.triton.device import sm_count


def space(m: int, n: int, k: int) -> list[paired.PairedConfig]:
    out = []
    if m <= 16:
        tiles = [(16, 64, 4, 4), (16, 128, 4, 4), (16, 256, 4, 3), (16, 128, 4, 6)]
    elif m <= 64:
        tiles = [(64, 64, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (64, 128, 4, 6), (64, 256, 8, 4)]
    else:
        tiles = [(64, 128, 4, 4), (128, 128, 8, 3), (128, 128, 4, 4), (128, 256, 8, 3), (64, 256, 4, 4)]
    for bm, bn, nw, st in tiles:
        t = -(-m // bm) * -(-n // bn)
        for sk in (1, 2, 4, 8):
            if sk > 1 and t * sk > 4 * sm_count():
                continue
            if k // (64 * sk) < 4:
                continue
            out.append(paired.PairedConfig(bm, bn, 64, 8, nw, st, sk))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ms", default="16,64,256")
    ap.add_argument("--models", default="llama3-8b,qwen2-1.5b")
    args = ap.parse_args()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    t0 = time.time()
    from trit import format as fmt
    from trit.synthetic import random_packed
    for (m, n, k, g, bk, sk) in [(3, 34, 128, 64, 64, 1), (17, 64, 576, 64, 32, 2), (5, 33, 192, -1, 64, 1),
                                 (100, 130, 256, 32, 32, 3), (300, 4098, 576, 64, 64, 1), (1, 1000, 4096, 128, 64, 4)]:
        packed = random_packed((n, k // 4), "cuda")
        scale = (torch.rand(n, fmt.num_groups(g, k), device="cuda") * 0.02 + 0.005).half()
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        r = paired.repack(packed, scale, g, rows=64)
        for cfg in (paired.PairedConfig(16, 32, bk, 1, 4, 2, sk), paired.PairedConfig(64, 128, bk, 8, 4, 3, 1)):
            y = paired.paired(x, r, config=cfg).float()
            want = ref_linear(x, packed, scale, g).float()
            yd = dequant.linear(x, packed.view(torch.int32), scale, g).float()
            print("check", m, n, k, g, cfg.block_m, float((y - want).norm() / want.norm()),
                  "dequant", float((yd - want).norm() / want.norm()), flush=True)
    for model in args.models.split(","):
        for layer, n, k in SHAPES[model]:
            t_bytes = ternary_bytes(n, k)
            copies = copies_for(t_bytes, l2)
            layers = [ternary_layer(n, k) for _ in range(copies)]
            reps = [paired.repack(p, s, GROUP) for p, s in layers]
            for m in (int(v) for v in args.ms.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                row = {"model": model, "layer": layer, "n": n, "k": k, "m": m}
                row["shipped_us"] = tuning.graph_time_us(
                    [lambda p=p, s=s: torch.ops.trit.linear(x, p, s, GROUP, None) for p, s in layers])
                row["dequant_us"] = tuning.graph_time_us(
                    [lambda p=p, s=s: dequant.linear(x, p.view(torch.int32), s, GROUP) for p, s in layers])
                best, us = tuning.tune(lambda c: [lambda r=r: paired.paired(x, r, config=c) for r in reps],
                                       space(m, n, k))
                row["paired_us"], row["paired_config"] = us, asdict(best)
                row["paired_unscaled_us"] = tuning.graph_time_us(
                    [lambda r=r: paired.paired(x, r, config=best, scaled=False) for r in reps])
                weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                           for _ in range(copies_for(n * k * 2, l2))]
                row["bf16_us"] = tuning.graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in weights])
                del weights
                y = paired.paired(x, reps[0], config=best).float()
                want = ref_linear(x, layers[0][0], layers[0][1], GROUP).float()
                row["rel_err"] = float((y - want).norm() / want.norm())
                yd = dequant.linear(x, layers[0][0].view(torch.int32), layers[0][1], GROUP).float()
                row["dequant_rel_err"] = float((yd - want).norm() / want.norm())
                row["speedup_paired"] = row["bf16_us"] / row["paired_us"]
                row["speedup_shipped"] = row["bf16_us"] / row["shipped_us"]
                rows.append(row)
                print(f"{model} {layer} M={m}: bf16 {row['bf16_us']:.1f} shipped {row['shipped_us']:.1f} "
                      f"dequant {row['dequant_us']:.1f} paired {us:.1f} (unscaled {row['paired_unscaled_us']:.1f}) "
                      f"x{row['speedup_paired']:.2f} vs x{row['speedup_shipped']:.2f} err {row['rel_err']:.4f} "
                      f"{best}", flush=True)
                args.out.write_text(json.dumps({"rows": rows}, indent=1))
            torch.cuda.empty_cache()
    for model in args.models.split(","):
        for m in (int(v) for v in args.ms.split(",")):
            sel = [r for r in rows if r["model"] == model and r["m"] == m]
            b = sum(r["bf16_us"] for r in sel)
            print(f"{model} M={m}: paired x{b / sum(r['paired_us'] for r in sel):.2f} "
                  f"shipped x{b / sum(r['shipped_us'] for r in sel):.2f}")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
