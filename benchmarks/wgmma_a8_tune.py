"""Tune the int8 wgmma kernel (``cuda_wgmma_a8``) on W1.58A8 layers (one scale a row, or ``--group 64|128``), beside bf16 cuBLAS and
the bf16 wgmma kernel on ``x_q / s`` (the path it replaces), in one run: CUDA-graph replays, weights rotated past
the L2, each time including the activations' rounding launch. Writes the timings and, with ``--tuned-out``, the
best configs into a tuned table (``configs.cuda_wgmma_a8``, keyed as :func:`trit.kernels.tuning.key` without
``,a8``, as ``trit bench kernels`` keys configs).

    python benchmarks/wgmma_a8_tune.py --models llama3-8b,bitnet-2b4t --ms 16,64,256,2048 --out a8_tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from trit import format as fmt
from trit.bench.kernels import SHAPES, copies_for, ternary_bytes, ternary_layer
from trit.kernels import tuning
from trit.kernels.cuda import launch, mma, nvrtc, wgmma, wgmma_a8
from trit.kernels.reference import linear_a8
from trit.kernels.triton.device import sm_count


def measure(model: str, layer: str, n: int, k: int, m: int, layers: list, reps: list, bf16: list,
            group: int) -> tuple[dict, object]:
    """One layer at M rows: the heuristic's config, the best of the search space, bf16 cuBLAS, the bf16 wgmma kernel
    on ``x_q / s``; the tuned config's error against the W1.58A8 reference."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def a8(cfg):
        return [lambda r=r: wgmma_a8.linear(x, r, cfg) for r in reps]

    cands = wgmma_a8.configs_for(m, reps[0], sm_count())
    nvrtc.precompile(wgmma_a8.source(), [wgmma_a8.kernel_name(c, group) for c in cands], arch_suffix="a")
    heur = wgmma_a8.heuristic(m, reps[0], sm_count())
    row = {"model": model, "layer": layer, "n": n, "k": k, "m": m, "candidates": len(cands), "heuristic": asdict(heur)}
    row["heuristic_us"] = tuning.graph_time_us(a8(heur))
    best, row["tuned_us"] = tuning.tune(a8, cands)
    row["tuned"] = asdict(best)
    row["bf16_us"] = tuning.graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in bf16])
    if wgmma.TUNE_MIN_M <= m <= wgmma.TUNE_MAX_M:  # the bf16 kernel on x_q / s, its heuristic config
        row["wgmma_xq_us"] = tuning.graph_time_us([lambda r=r: wgmma.linear(launch.fake_quantize(x), r) for r in reps])
    y = wgmma_a8.linear(x, reps[0], best).float()
    packed, scale = layers[0]  # the W1.58A8 reference on the scales the layout holds (bf16)
    want = linear_a8(x.float(), packed, scale.to(torch.bfloat16).float(), group)
    row["rel_err_vs_reference"] = float((y - want).norm() / want.norm())
    print(f"{model} {layer} M={m}: bf16 {row['bf16_us']:.1f} us, a8 heuristic {row['heuristic_us']:.1f}, "
          f"tuned {row['tuned_us']:.1f} ({best}), wgmma on x_q/s {row.get('wgmma_xq_us', float('nan')):.1f}, "
          f"err {row['rel_err_vs_reference']:.1e}", flush=True)
    return row, best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama3-8b,bitnet-2b4t")
    ap.add_argument("--ms", default="16,64,256,2048")
    ap.add_argument("--group", type=int, default=fmt.PER_ROW, choices=wgmma_a8.GROUPS,
                    help="inputs a scale (-1: one scale a row, as BitNet's imports)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tuned-out", type=Path, default=None, help="merge the best configs into this table")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    G = args.group
    rows, best_cfgs = [], {}
    for model in args.models.split(","):
        for layer, n, k in SHAPES[model]:
            copies = copies_for(ternary_bytes(n, k, G), l2)
            layers = [ternary_layer(n, k, G) for _ in range(copies)]
            reps = [mma.repack(p, s, G, k) for p, s in layers]
            bf16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
            for m in [int(v) for v in args.ms.split(",")]:
                row, best = measure(model, layer, n, k, m, layers, reps, bf16, G)
                rows.append(row)
                best_cfgs[tuning.key(m, n, k, G, torch.bfloat16)] = asdict(best)
                args.out.write_text(json.dumps({"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                                                "torch": torch.__version__, "rows": rows}, indent=1))
            del layers, reps, bf16
    if args.tuned_out is not None:
        table = json.loads(args.tuned_out.read_text()) if args.tuned_out.is_file() else {"configs": {}, "choice": {}}
        table.setdefault("configs", {}).setdefault("cuda_wgmma_a8", {}).update(best_cfgs)
        table["command"] = f"{table.get('command', '')}; then, cuda_wgmma_a8: python {' '.join(sys.argv)}"
        args.tuned_out.write_text(json.dumps(table, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
