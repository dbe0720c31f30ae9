"""Experiment: programmatic dependent launch (``TRIT_PDL=1``) on a decode step's chain of kernels.

    PYTHONPATH=src python benchmarks/exp_pdl.py --out $OUT/pdl.json [--model llama3-8b] [--ms 1,16] [--layers 32]

A CUDA graph of ``--layers`` decoder layers as a decode step runs them, without
attention: RMS norm, qkv, a residual add, o, norm, gate_up, SiLU * up, down, each
layer its own weights (so nothing stays in L2 from one layer to the next). The
norms and elementwise kernels are the kernels ahead of each linear, as in a
server. Timed with trit's kernels (the CUDA kernels on the mma layout, or with
``--layout v1`` format v1's Triton kernels) launched plainly and with
programmatic dependent launch, and with bf16 ``F.linear``, all in one run
(the three graphs' replays taking turns). One replay of each under the profiler
gives the time its kernels kept the GPU busy and its first-to-last span: the
span less the busy time is the gaps between kernels. Both outputs of the last
replays, plain and PDL, must be equal.
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
from trit.kernels import pdl
from trit.kernels.cuda import mma


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


def capture(step) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A CUDA graph of one step (warmed up outside it first: compiles and allocates), and its output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    graph.replay()
    torch.cuda.synchronize()
    return graph, y


def replay_us(graphs: dict, reps: int = 20) -> dict:
    """Median replay time of each graph, us; the graphs take turns, so drift in clocks hits them alike."""
    times = {name: [] for name in graphs}
    for _ in range(reps):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def busy_and_span_us(graph: torch.cuda.CUDAGraph) -> tuple[float, float]:
    """One replay under the profiler: the time some kernel of it ran (the union of their intervals) and its
    first kernel's start to its last one's end, us. Under PDL a kernel's interval includes its wait."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA)
    busy, reach = 0.0, float("-inf")
    for a, b in spans:
        if b > reach:
            busy += b - max(a, reach)
            reach = b
    return busy, (spans[-1][1] - spans[0][0]) if spans else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--layout", choices=("mma", "v1"), default="mma",
                    help="every layer in the mma layout (the CUDA kernels) or in format v1 (the Triton kernels)")
    args = ap.parse_args(argv)
    shapes = {layer: (n, k) for layer, n, k in SHAPES[args.model]}
    hidden = shapes["o"][0]
    t0 = time.time()
    tiled, dense = [], []
    for _ in range(args.layers):
        t, d = {}, {}
        for layer, (n, k) in shapes.items():
            p, s = ternary_layer(n, k)
            t[layer] = mma.repack(p, s, GROUP, k) if args.layout == "mma" else (p, s)
            d[layer] = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.01
        tiled.append(t)
        dense.append(d)

    def trit_linear(x, r):
        if args.layout == "v1":
            return torch.ops.trit.linear(x, r[0], r[1], GROUP, None)
        return torch.ops.trit.linear_tiled(x, r.wq, r.sc, r.n, GROUP, None)

    out = {"command": "python benchmarks/exp_pdl.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": torch.cuda.get_device_name(), "model": args.model, "layers": args.layers,
           "layout": args.layout, "rows": []}
    for m in [int(v) for v in args.ms.split(",")]:
        x0 = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
        row = {"m": m}
        graphs, outs = {}, {}
        for name, flag, layers, linear in (("trit", "0", tiled, trit_linear), ("trit_pdl", "1", tiled, trit_linear),
                                           ("bf16", "0", dense, torch.nn.functional.linear)):
            os.environ[pdl.ENV] = flag  # read at each launch, so also while the graph is captured
            graphs[name], outs[name] = capture(step_fn(x0, layers, linear, shapes["o"][1]))
        os.environ[pdl.ENV] = "0"
        for name, us in replay_us(graphs).items():
            row[f"{name}_step_us"] = us
        for name, graph in graphs.items():
            row[f"{name}_busy_us"], row[f"{name}_span_us"] = busy_and_span_us(graph)
        row["pdl_equal"] = bool(torch.equal(outs["trit"], outs["trit_pdl"]))  # both graphs' last replays
        del graphs, outs
        print(f"M={m}: " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
        out["rows"].append(row)
    out["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
