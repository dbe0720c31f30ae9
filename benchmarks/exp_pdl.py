"""Experiment: programmatic dependent launch (``TRIT_PDL=1``) on a decode step's chain of kernels.

    PYTHONPATH=src python benchmarks/exp_pdl.py --out $OUT/pdl.json [--model llama3-8b] [--ms 1,16] [--layers 32]

A CUDA graph of ``--layers`` decoder layers as a decode step runs them, without
attention: RMS norm, qkv, a residual add, o, norm, gate_up, SiLU * up, down, each
layer its own weights (so nothing stays in L2 from one layer to the next). The
norms and elementwise kernels are the kernels ahead of each linear, as in a
server. Timed with trit's CUDA kernels on the mma layout launched plainly and
with programmatic dependent launch, and with bf16 ``F.linear``, all in one run;
the replay's wall time a step and the sum of its kernels' times (the profiler)
give the gaps between kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import trit.ops  # noqa: F401  (registers trit::linear_tiled)
from trit.bench.kernels import GROUP, SHAPES, ternary_layer
from trit.kernels import tuning
from trit.kernels.cuda import mma, nvrtc


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


def step_fn(x0: torch.Tensor, layers: list[dict], linear, q: int) -> callable:
    def step() -> torch.Tensor:
        h = x0
        for w in layers:
            a = linear(rms(h), w["qkv"])
            h = h + linear(a[:, :q].contiguous(), w["o"])
            gu = linear(rms(h), w["gate_up"])
            g, u = gu.chunk(2, dim=-1)
            h = h + linear((torch.nn.functional.silu(g) * u).contiguous(), w["down"])
        return h
    return step


def kernel_us(step) -> float:
    """The sum of the step's GPU kernel times (one eager run under the profiler), us."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args(argv)
    shapes = {layer: (n, k) for layer, n, k in SHAPES[args.model]}
    hidden = shapes["o"][0]
    t0 = time.time()
    tiled, dense = [], []
    for _ in range(args.layers):
        t, d = {}, {}
        for layer, (n, k) in shapes.items():
            p, s = ternary_layer(n, k)
            t[layer] = mma.repack(p, s, GROUP, k)
            d[layer] = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.01
        tiled.append(t)
        dense.append(d)

    def trit_linear(x, r):
        return torch.ops.trit.linear_tiled(x, r.wq, r.sc, r.n, GROUP, None)

    out = {"command": "python benchmarks/exp_pdl.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": torch.cuda.get_device_name(), "model": args.model, "layers": args.layers, "rows": []}
    for m in [int(v) for v in args.ms.split(",")]:
        x0 = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
        row = {"m": m}
        for name, pdl, layers, linear in (("trit", "0", tiled, trit_linear), ("trit_pdl", "1", tiled, trit_linear),
                                          ("bf16", "0", dense, torch.nn.functional.linear)):
            os.environ[nvrtc.PDL_ENV] = pdl  # read at each launch, so also while the graph is captured
            step = step_fn(x0, layers, linear, shapes["o"][1])
            times = tuning.graph_times_us([step], reps=20)
            row[f"{name}_step_us"] = times[len(times) // 2]
            row[f"{name}_kernel_us"] = kernel_us(step)
        os.environ[nvrtc.PDL_ENV] = "0"
        y0 = step_fn(x0, tiled, trit_linear, shapes["o"][1])()
        os.environ[nvrtc.PDL_ENV] = "1"
        row["pdl_equal"] = bool(torch.equal(step_fn(x0, tiled, trit_linear, shapes["o"][1])(), y0))
        os.environ[nvrtc.PDL_ENV] = "0"
        print(f"M={m}: " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
        out["rows"].append(row)
    out["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
