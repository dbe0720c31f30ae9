"""The int8 lm_head against the bf16 one on the GPU: time a call, bytes at what share of the copy bandwidth.

    PYTHONPATH=src python benchmarks/lm_head_speed.py --out lm_head_speed.json [--models llama3-8b,qwen2-1.5b,27b]

For each shape's output layer (vocab x hidden, from the shapes ``trit bench serve``
builds) and each M (tokens whose logits a step computes: the decode batch),
times bf16 ``F.linear`` (cuBLAS) and :func:`trit.kernels.int8_rows.linear` (the
Triton kernel on int8 rows) in CUDA-graph replays, the copy bandwidth in the same
run, and a few other configs of the kernel beside its default (``other_configs_us``). Each head is 0.5 GB
or more in int8, several times the H200's 60 MB L2,
so one call finds nothing of it cached. Also each row's error against the
plain-PyTorch reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import astuple
from pathlib import Path

import torch

MS = (1, 4, 16, 64, 128, 256)


def time_head(model: str, n: int, k: int, copy_bw: float) -> list[dict]:
    from trit.kernels import int8_rows
    from trit.kernels.triton import int8_rows as kernel
    from trit.kernels.tuning import graph_time_us

    CANDIDATES = [kernel.Int8RowsConfig(*c) for c in (  # block_m, block_n, block_k, warps, stages
        (16, 64, 256, 4, 4), (16, 128, 128, 4, 4), (16, 32, 512, 4, 3), (16, 64, 128, 4, 6),
        (64, 64, 128, 4, 3), (64, 128, 64, 4, 3), (32, 128, 128, 4, 4), (128, 128, 64, 8, 3), (64, 128, 128, 8, 3))]

    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    q, s = int8_rows.quantize_rows(w)
    rows = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bf16_us = graph_time_us([lambda x=x: torch.nn.functional.linear(x, w)], reps=20)
        int8_us = graph_time_us([lambda x=x: int8_rows.linear(x, q, s)], reps=20)
        others = {",".join(map(str, astuple(c))): graph_time_us([lambda x=x, c=c: kernel.linear(x, q, s, c)], reps=20)
                  for c in CANDIDATES if c != kernel.default_config(m) and (c.block_m <= 16) == (m <= 16)}
        ref = int8_rows.reference(x, q, s).double()
        err = ((int8_rows.linear(x, q, s).double() - ref).norm() / ref.norm()).item()
        nbytes = n * k + 4 * n + m * k * 2 + m * n * 2
        row = {"model": model, "n": n, "k": k, "m": m, "bf16_us": bf16_us, "int8_us": int8_us,
               "speedup_vs_bf16": bf16_us / int8_us, "int8_bytes": nbytes,
               "int8_frac_copy_bw": nbytes / (int8_us * 1e-6) / copy_bw, "rel_err_vs_reference": err,
               "config": ",".join(map(str, astuple(kernel.default_config(m)))), "other_configs_us": others}
        rows.append(row)
        print(f"{model:11} {n}x{k} M={m:<4} bf16 {bf16_us:8.1f} us  int8 {int8_us:8.1f} us  "
              f"x{row['speedup_vs_bf16']:.2f}  {row['int8_frac_copy_bw']:.0%} of copy bw  err {err:.1e}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama3-8b,qwen2-1.5b,27b")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import triton

    from trit.bench.decode import SHAPES
    from trit.bench.kernels import copy_bandwidth

    start = time.time()
    copy_bw = copy_bandwidth()
    result = {"command": "PYTHONPATH=src python benchmarks/lm_head_speed.py " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bandwidth_bytes_per_s": copy_bw, "rows": []}
    for model in args.models.split(","):
        result["rows"] += time_head(model, SHAPES[model]["vocab_size"], SHAPES[model]["hidden_size"], copy_bw)
        torch.cuda.empty_cache()
    result["seconds"] = time.time() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
