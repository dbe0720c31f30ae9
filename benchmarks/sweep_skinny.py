"""Time the skinny tensor-core kernel against what ``trit::linear`` runs today and bf16 cuBLAS, config by config.

One GPU, weights rotated over copies that together are at least four times the
L2 (as in ``trit bench kernels``), CUDA-graph replays, all in one run. Each
config's output is compared with the op's (relative error, kept beside its
time). From the repository root:

    PYTHONPATH=src python3 benchmarks/sweep_skinny.py --out $OUT/sweep_skinny.json

A config is ``SkinnyConfig``'s fields (block_n, block_k, split_k, num_warps,
num_stages, steps), comma-separated; ``--configs`` replaces the default list.
``--kernel-file`` times a variant of ``src/trit/kernels/skinny.py`` (a copy with
a change) instead of the shipped kernel, against the same op and cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
GROUP = 64
DEFAULT_CONFIGS = " ".join(
    [f"64,64,{sk},4,4,{st}" for sk in (1, 2, 4, 8, 16) for st in (1, 2)]
    + [f"128,64,{sk},4,{ns},{st}" for sk in (2, 4, 8) for st in (1, 2) for ns in (3, 5)]
    + [f"128,64,{sk},8,4,{st}" for sk in (2, 4, 8) for st in (1, 2)]
    + ["256,64,2,8,4,1", "256,64,4,8,4,1"])


def load_kernel_file(path: Path):
    """A skinny kernel module from a file (a variant of ``trit.kernels.skinny``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("skinny_variant", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["skinny_variant"] = mod
    spec.loader.exec_module(mod)
    return mod


def sweep(configs: list[tuple[int, ...]], ms: list[int], kernel_file: Path | None = None) -> dict:
    import torch
    import torch.nn.functional as F

    import trit.ops  # noqa: F401  registers torch.ops.trit.linear
    from trit.bench.kernels import copies_for, copy_bandwidth, ternary_layer
    from trit.kernels import skinny, tuning

    if kernel_file is not None:
        skinny = load_kernel_file(kernel_file)  # noqa: F811

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"command": sys.argv, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "copy_bandwidth_bytes_per_s": copy_bandwidth(), "rows": []}
    for m in ms:
        for n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            layers = [ternary_layer(n, k) for _ in range(copies_for(n * k // 4, l2))]
            dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                     for _ in range(copies_for(n * k * 2, l2, cap=16))]

            def op_calls(x=x, layers=layers):
                return [lambda p=p, s=s: torch.ops.trit.linear(x, p, s, GROUP, None) for p, s in layers]

            ref = op_calls()[0]().float()
            row = {"m": m, "n": n, "k": k, "op_us": tuning.graph_time_us(op_calls()),
                   "bf16_us": tuning.graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in dense]),
                   "ternary_bytes": layers[0][0].numel() + layers[0][1].numel() * 2, "skinny": {}}
            for fields in configs:
                cfg = skinny.SkinnyConfig(*fields)

                def calls(cfg=cfg, x=x, layers=layers):
                    return [lambda p=p, s=s: skinny.skinny(x, p.view(torch.int32), s, GROUP, None, cfg)
                            for p, s in layers]
                try:
                    err = ((calls()[0]().float() - ref).norm() / ref.norm()).item()
                    row["skinny"][",".join(map(str, fields))] = (tuning.graph_time_us(calls(), reps=5), err)
                except Exception as e:  # a config that does not compile or run
                    row["skinny"][",".join(map(str, fields))] = (None, repr(e)[:200])
            out["rows"].append(row)
            print(summary_line(row), flush=True)
    return out


def summary_line(row: dict) -> str:
    timed = [(v[0], cfg, v[1]) for cfg, v in row["skinny"].items() if v[0]]
    if not timed:
        return f"| M={row['m']} {row['n']}x{row['k']} | {row['op_us']:.2f} | {row['bf16_us']:.2f} | none ran |"
    us, cfg, err = min(timed)
    return (f"| M={row['m']} {row['n']}x{row['k']} | {row['op_us']:.2f} | {row['bf16_us']:.2f} | {us:.2f} | {cfg} "
            f"| {err:.1e} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", type=Path, help="print the best config per problem of this file")
    ap.add_argument("--kernel-file", type=Path, help="a variant of src/trit/kernels/skinny.py to time instead")
    a = ap.parse_args()
    if a.summary:
        rows = json.loads(a.summary.read_text())["rows"]
    else:
        t0 = time.time()
        configs = [tuple(int(v) for v in c.split(",")) for c in a.configs.split()]
        result = sweep(configs, a.ms, a.kernel_file)
        result["seconds"] = time.time() - t0
        rows = result["rows"]
        if a.out:
            a.out.write_text(json.dumps(result, indent=1))
    print("| problem | op then, us | bf16, us | skinny best, us | its config | rel. err |\n|---|---|---|---|---|---|")
    for row in rows:
        print(summary_line(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
