"""Long prefills: dequantize + cuBLAS with the dense weight whole, against a chunk at a time through one buffer.

    PYTHONPATH=src python3 benchmarks/dequant_chunks.py --out dequant_chunks.json [--ms 1024 2048] [--budgets 8 16 32]

For each layer shape of ``trit bench kernels`` and each M, in one run: bf16
``F.linear`` (cuBLAS), ``dequant.linear`` with the weight written whole, and
with it written ``chunk_rows`` rows at a time (the rows that fit each
``--budgets`` MiB buffer, :func:`chunked_linear`), plus the dequantize kernel alone (whole weight).
Device time from CUDA graph replays; the ternary weights rotate over copies
several times the L2, as in ``trit bench kernels``. Each chunked result's
largest difference from the whole one, relative to the largest output, is
recorded too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from trit.bench.kernels import GROUP, SHAPES, copies_for, copy_bandwidth, ternary_bytes, ternary_layer
from trit.kernels import dequant, tuning


def chunk_rows_for(budget_bytes: int, k: int, elem: int = 2) -> int:
    return max(128, budget_bytes // (elem * k) // 128 * 128)


def chunked_linear(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, group_size: int,
                   chunk_rows: int) -> torch.Tensor:
    """``x @ W.T``, the dense weight ``chunk_rows`` rows at a time into one buffer (L2-sized), each chunk
    multiplied straight into its columns of the output, the next chunk overwriting the same buffer."""
    n, k = words.shape[0], x.shape[-1]
    y = torch.empty((x.shape[0], n), device=x.device, dtype=x.dtype)
    buf = torch.empty((chunk_rows, k), device=x.device, dtype=x.dtype)
    for n0 in range(0, n, chunk_rows):
        n1 = min(n, n0 + chunk_rows)
        w = dequant.dequantize(words[n0:n1], scale[n0:n1], group_size, k, x.dtype, out=buf[: n1 - n0])
        torch.mm(x, w.T, out=y[:, n0:n1])
    return y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[2048])
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 24, 32], help="chunk buffer sizes, MiB")
    args = ap.parse_args(argv)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    start = time.time()
    rows = []
    copy_bw = copy_bandwidth()
    for model, shapes in SHAPES.items():
        for layer, n, k in shapes:
            t_bytes = ternary_bytes(n, k)
            layers = [ternary_layer(n, k) for _ in range(copies_for(t_bytes, l2))]
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
            dense = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
            deq_us = tuning.graph_time_us([
                lambda p=p, s=s, k=k, dense=dense: dequant.dequantize(p.view(torch.int32), s, GROUP, k, torch.bfloat16,
                                                                     out=dense)
                for p, s in layers])
            for m in args.ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                row = {"model": model, "layer": layer, "n": n, "k": k, "m": m,
                       "dequant_alone_us": deq_us,
                       "dequant_alone_frac_copy_bw": (t_bytes + n * k * 2) / (deq_us * 1e-6) / copy_bw}
                row["bf16_us"] = tuning.graph_time_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in weights])
                whole = dequant.linear(x, layers[0][0].view(torch.int32), layers[0][1], GROUP)
                row["whole_us"] = tuning.graph_time_us(
                    [lambda p=p, s=s, x=x: dequant.linear(x, p.view(torch.int32), s, GROUP) for p, s in layers])
                row["chunked"] = []
                for mib in args.budgets:
                    cr = chunk_rows_for(mib << 20, k)
                    if cr >= n:
                        continue
                    got = chunked_linear(x, layers[0][0].view(torch.int32), layers[0][1], GROUP, cr)
                    err = ((got.float() - whole.float()).abs().max() / whole.float().abs().max()).item()
                    us = tuning.graph_time_us([
                        lambda p=p, s=s, cr=cr, x=x: chunked_linear(x, p.view(torch.int32), s, GROUP, cr)
                        for p, s in layers])
                    row["chunked"].append({"budget_mib": mib, "chunk_rows": cr, "us": us, "rel_err_vs_whole": err})
                best = min([row["whole_us"]] + [c["us"] for c in row["chunked"]])
                row["speedup_whole"] = row["bf16_us"] / row["whole_us"]
                row["speedup_best"] = row["bf16_us"] / best
                rows.append(row)
                print(json.dumps(row), flush=True)
            del layers, weights, dense
            torch.cuda.empty_cache()
    summed = {}
    for model in SHAPES:
        for m in args.ms:
            sel = [r for r in rows if r["model"] == model and r["m"] == m]
            bf = sum(r["bf16_us"] for r in sel)
            summed[f"{model} M={m}"] = {
                "whole": bf / sum(r["whole_us"] for r in sel),
                **{f"{mib} MiB": bf / sum(next((c["us"] for c in r["chunked"] if c["budget_mib"] == mib),
                                               r["whole_us"]) for r in sel) for mib in args.budgets},
                "best per layer": bf / sum(r["bf16_us"] / r["speedup_best"] for r in sel)}
    result = {"command": " ".join(["benchmarks/dequant_chunks.py", *sys.argv[1:]]), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "copy_bandwidth_bytes_per_s": copy_bw, "l2_bytes": l2,
              "seconds": time.time() - start, "summed_speedup_vs_bf16": summed, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summed, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
