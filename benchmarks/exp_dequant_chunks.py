"""Experiment: dequantize + cuBLAS in row chunks through one reused buffer (``TRIT_DEQUANT_CHUNK_MB``) against
the shipped one-shot path and bf16 cuBLAS, in both layouts.

    PYTHONPATH=src python benchmarks/exp_dequant_chunks.py --out $OUT/chunks.json [--ms 256,512,2048] [--mb 12,24,48]

For each layer shape of Llama-3-8B and the 27B shape and each M: bf16 ``F.linear``,
format v1's Triton dequantizer + cuBLAS and the mma layout's CUDA dequantizer +
cuBLAS, each in one piece and in chunks of each buffer size, timed in CUDA-graph
replays with the weights rotated over copies several times the L2; each chunked
result is checked against its one-piece result first. The copy bandwidth is
measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from trit.bench.kernels import GROUP, SHAPES, copies_for, copy_bandwidth, ternary_bytes, ternary_layer
from trit.kernels import chunked, tuning
from trit.kernels.cuda import launch, mma
from trit.kernels.triton import dequant


def timed(calls: list, mb: float) -> float:
    os.environ[chunked.ENV] = str(mb)  # read at each call, so also while the graph is captured
    return tuning.graph_time_us(calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="256,512,2048")
    ap.add_argument("--mb", default="12,24,48", help="buffer sizes to time, MiB")
    ap.add_argument("--models", default="llama3-8b,27b")
    args = ap.parse_args(argv)
    ms, mbs = [int(v) for v in args.ms.split(",")], [float(v) for v in args.mb.split(",")]
    dev = torch.cuda.get_device_properties(0)
    out = {"command": "python benchmarks/exp_dequant_chunks.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": dev.name, "l2_bytes": dev.L2_cache_size, "copy_bandwidth_bytes_per_s": copy_bandwidth(),
           "rows": []}
    t0 = time.time()
    for model in args.models.split(","):
        for layer, n, k in SHAPES[model]:
            v1 = [ternary_layer(n, k) for _ in range(copies_for(ternary_bytes(n, k), dev.L2_cache_size))]
            tiled = [mma.repack(p, s, GROUP, k) for p, s in v1]
            dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                     for _ in range(copies_for(2 * n * k, dev.L2_cache_size, cap=8))]
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                row = {"model": model, "layer": layer, "n": n, "k": k, "m": m,
                       "bf16_us": tuning.graph_time_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in dense])}
                paths = {"v1": [lambda p=p, s=s, x=x: dequant.linear(x, p.view(torch.int32), s, GROUP) for p, s in v1],
                         "mma": [lambda r=r, x=x: launch.run_dequant(x, r, None) for r in tiled]}
                for name, calls in paths.items():
                    row[f"{name}_one_piece_us"] = timed(calls, 0)
                    os.environ[chunked.ENV] = "0"
                    whole = calls[0]().float()
                    for mb in mbs:
                        rows = chunked.rows_per_chunk(n, k, 2, int(mb * 2**20), mma.ROW_TILE if name == "mma" else 1)
                        if rows >= n:  # the buffer holds the whole layer: the one-piece path, timed above
                            continue
                        os.environ[chunked.ENV] = str(mb)
                        err = (calls[0]().float() - whole).abs().max().item() / whole.abs().max().item()
                        if err > 2**-7:
                            raise SystemExit(f"{model} {layer} M={m} {name} {mb:g} MiB: chunked result off by {err:.3g}")
                        row[f"{name}_{mb:g}MB_us"] = timed(calls, mb)
                        row[f"{name}_{mb:g}MB_rows"] = rows
                        row[f"{name}_{mb:g}MB_rel_err"] = err
                    del whole
                os.environ[chunked.ENV] = "0"
                best = min(((v, key) for key, v in row.items() if key.endswith("MB_us")), default=(float("nan"), "-"))
                print(f"{model:>9} {layer:>7} M={m:<5} bf16 {row['bf16_us']:8.1f}  one piece v1 "
                      f"{row['v1_one_piece_us']:8.1f} mma {row['mma_one_piece_us']:8.1f}  best chunked {best[1]} "
                      f"{best[0]:8.1f} us", flush=True)
                out["rows"].append(row)
                out["seconds"] = time.time() - t0
                with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
                    json.dump(out, f, indent=1)
            del v1, tiled, dense, paths, x  # the timed calls hold the layers too
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
