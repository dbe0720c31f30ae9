"""Time a GEMV variant against the shipped one, config by config, weights rotated past the L2 (one GPU).

    git show d57f38a:src/trit/kernels/gemv.py > /tmp/gemv_base.py
    cp /tmp/gemv_base.py /tmp/gemv_variant.py && patch /tmp/gemv_variant.py < vec_x.patch
    PYTHONPATH=src python benchmarks/results/gemv-variants/sweep.py /tmp/gemv_base.py /tmp/gemv_variant.py \\
        --configs "16,32,1,4 32,32,1,4" --ms 1 4 --out $OUT/sweep.json
    python benchmarks/results/gemv-variants/sweep.py --summary benchmarks/results/gemv-variants/sweep_*.json

A config is the variant's ``GemvConfig`` fields, comma-separated. The base runs
with the shipped tuned table's config for each problem; each variant config's
output is compared with the base's (relative error, stored beside its time).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]
GROUP = 64


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def sweep(base_path: Path, variant_path: Path, configs: list[tuple[int, ...]], ms: list[int]) -> list[dict]:
    import torch

    from trit.bench.kernels import copies_for, ternary_layer
    from trit.kernels import tuning

    base, variant = load(base_path, "gemv_base"), load(variant_path, "gemv_variant")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for m in ms:
        for n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            layers = [ternary_layer(n, k) for _ in range(copies_for(n * k // 4, l2))]
            key = tuning.key(m, n, k, GROUP, torch.bfloat16)
            bcfg = tuning.lookup("gemv", key, base.GemvConfig) or base.default_config(n, k, m)

            def calls(mod, cfg, x=x, layers=layers):
                return [lambda p=p, s=s: mod.gemv(x, p.view(torch.int32), s, GROUP, None, cfg) for p, s in layers]

            ref = calls(base, bcfg)[0]().float()
            row = {"m": m, "n": n, "k": k, "old_us": tuning.graph_time_us(calls(base, bcfg)), "old_cfg": str(bcfg),
                   "new": {}}
            for fields in configs:
                cfg = variant.GemvConfig(*fields)
                try:
                    err = ((calls(variant, cfg)[0]().float() - ref).norm() / ref.norm()).item()
                    row["new"][str(cfg)] = (tuning.graph_time_us(calls(variant, cfg), reps=5), err)
                except Exception as e:  # a config that does not compile or run
                    row["new"][str(cfg)] = (None, repr(e)[:300])
            rows.append(row)
            print(summary_line(row), flush=True)
    return rows


def summary_line(row: dict) -> str:
    timed = [(v[0], cfg) for cfg, v in row["new"].items() if v[0]]
    if not timed:  # every config failed: show the first error
        return f"| M={row['m']} {row['n']}x{row['k']} | {row['old_us']:.2f} | none ran: {next(iter(row['new'].values()))[1]} |"
    us, cfg = min(timed)
    return f"| M={row['m']} {row['n']}x{row['k']} | {row['old_us']:.2f} | {us:.2f} | {cfg} |"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path, nargs="?")
    ap.add_argument("variant", type=Path, nargs="?")
    ap.add_argument("--configs", default="")
    ap.add_argument("--ms", type=int, nargs="+", default=[1])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", type=Path, nargs="+", help="print the best config per problem of these files")
    a = ap.parse_args()
    if a.summary:
        for path in a.summary:
            print(f"\n{path.name}\n\n| problem | shipped, us | variant's best, us | its config |\n|---|---|---|---|")
            for row in json.loads(path.read_text()):
                print(summary_line(row))
        return 0
    configs = [tuple(int(v) for v in c.split(",")) for c in a.configs.split()]
    rows = sweep(a.base, a.variant, configs, a.ms)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
