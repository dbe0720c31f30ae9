"""The warp-specialized wgmma kernel and the wgmma space's fewer-stage configs against the shipped dispatch, on
Llama-3-8B's four layers in the mma layout: each subspace's best config and time, bf16 F.linear in the same run
(CUDA graphs, weights rotated past the L2). ``python benchmarks/exp_wgmma_ws.py --ms 16,64,256 --out X.json``
(an sm_90 GPU)."""
import argparse
import dataclasses
import json
import time

import torch

import trit.ops  # noqa: F401
from trit.bench.kernels import GROUP, copies_for, ternary_bytes, ternary_layer
from trit.kernels import tuning
from trit.kernels.cuda import mma, nvrtc, wgmma
from trit.kernels.triton.device import sm_count

ap = argparse.ArgumentParser()
ap.add_argument("--ms", default="16,64,256")
ap.add_argument("--out", required=True)
args = ap.parse_args()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
rows = []
t0 = time.time()
for layer, (n, k) in shapes.items():
    copies = copies_for(ternary_bytes(n, k), l2)
    reps = [mma.repack(p, s, GROUP, k) for p, s in (ternary_layer(n, k) for _ in range(copies))]
    for m in [int(v) for v in args.ms.split(",")]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row = {"layer": layer, "n": n, "k": k, "m": m}
        row["shipped_us"] = tuning.graph_time_us([lambda r=r, x=x: torch.ops.trit.linear_tiled(x, r.wq, r.sc, r.n, GROUP, None)
                                                  for r in reps])
        cands = wgmma.configs_for(m, reps[0], sm_count())
        nvrtc.precompile(wgmma.source(), sorted({wgmma.kernel_name(c, GROUP) for c in cands}), arch_suffix="a")
        want = torch.ops.trit.linear_tiled(x, reps[0].wq, reps[0].sc, reps[0].n, GROUP, None).float()
        for name, sub in (("plain", [c for c in cands if not c.ws]), ("ws", [c for c in cands if c.ws])):
            best, us = tuning.tune(lambda cfg, x=x, reps=reps: [lambda r=r: wgmma.linear(x, r, cfg) for r in reps], sub)
            got = wgmma.linear(x, reps[0], best).float()
            row[name] = {"config": dataclasses.asdict(best), "us": us,
                         "rel_diff_vs_shipped": float((got - want).norm() / want.norm())}
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
        row["bf16_us"] = tuning.graph_time_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in ws])
        del ws
        rows.append(row)
        json.dump({"command": "python benchmarks/exp_wgmma_ws.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
                   "device": torch.cuda.get_device_name(), "rows": rows}, open(args.out, "w"), indent=1)
        print(f"{layer:8s} M={m:4d} shipped {row['shipped_us']:7.1f}  plain {row['plain']['us']:7.1f} "
              f"{row['plain']['config']}  ws {row['ws']['us']:7.1f} {row['ws']['config']}  bf16 {row['bf16_us']:7.1f}"
              f"  diff {row['ws']['rel_diff_vs_shipped']:.1e}  t={time.time() - t0:.0f}s", flush=True)
