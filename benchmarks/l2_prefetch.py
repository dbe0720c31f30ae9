"""Does asking the L2 for the next layers during attention shorten a decode step? (``TRIT_PREFETCH_MB``)

    python benchmarks/l2_prefetch.py --out benchmarks/results/experiments/l2_prefetch_<gpu>.json
        [--layers 8] [--ms 1,4,16] [--gap-us 15] [--budgets 0,8,16,24,32,40]

A CUDA graph of ``--layers`` Llama-3-8B decoder layers' linears as the server runs them (qkv, gate_up and down
in the mma layout, o in format v1, each through its ``trit`` op), with a sleep kernel of ``--gap-us`` after
qkv standing in for attention (which reads little memory), replayed with weights rotated past the L2. Each
budget links every qkv to what follows (:mod:`trit.kernels.cuda.prefetch`); 0 is the plain build. Reports
the step time, and the linears' time (step less the sleeps), against the same chain in bf16 (``F.linear``)
and the copy bandwidth measured in the run. The outputs of every budget are checked equal to the plain
build's (one K split is not forced, so up to the split-K sums' order: compared within bf16 rounding).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 64


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--gap-us", type=float, default=15.0, help="the sleep after qkv that stands in for attention")
    ap.add_argument("--budgets", default="0,8,16,24,32,40", help="megabytes each qkv prefetches (0: off)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import trit.ops  # noqa: F401  (the ops)
    from trit.bench.kernels import copy_bandwidth
    from trit.kernels import tuning
    from trit.kernels.cuda import launch, mma, prefetch

    def graph_us(step) -> float:  # one replay of the step's graph, median
        return tuning.graph_time_us([step], reps=args.reps)
    from trit.synthetic import random_packed

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layer = {}
        for name, (n, k) in SHAPES.items():
            packed = random_packed((n, k // 4), "cuda")
            scale = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.005).to(torch.float16)
            layer[name] = (packed, scale) if name == "o" else mma.repack(packed, scale, GROUP, k)  # o: format v1
        layers.append(layer)
    dense = [{name: torch.randn(*SHAPES[name], dtype=torch.bfloat16, device="cuda") * 0.02 for name in SHAPES}
             for _ in range(args.layers)]
    freq_khz = torch.cuda.get_device_properties(0).clock_rate  # kHz
    cycles = int(args.gap_us * freq_khz / 1e3)

    def run(w, x):
        if isinstance(w, tuple):  # format v1
            return torch.ops.trit.linear(x, w[0], w[1], GROUP)
        return torch.ops.trit.linear_tiled(x, w.wq, w.sc, w.n, GROUP)

    def tensors(w) -> list[torch.Tensor]:  # what the kernels read, scales first
        return [w[1], w[0]] if isinstance(w, tuple) else [w.sc, w.wq]

    def trit_step(x, outs):
        for i, layer in enumerate(layers):
            run(layer["qkv"], x)
            torch.cuda._sleep(cycles)
            run(layer["o"], x)
            h = run(layer["gate_up"], x)
            outs[i] = run(layer["down"], h[:, :14336].contiguous())

    def bf16_step(x, outs):
        for i, layer in enumerate(dense):
            torch.nn.functional.linear(x, layer["qkv"])
            torch.cuda._sleep(cycles)
            torch.nn.functional.linear(x, layer["o"])
            h = torch.nn.functional.linear(x, layer["gate_up"])
            outs[i] = torch.nn.functional.linear(h[:, :14336].contiguous(), layer["down"])

    def link(budget_mb: float) -> int:
        prefetch.reset()
        launch._PLANS.clear()
        for i, layer in enumerate(layers):  # vLLM's names and order
            for name in ("qkv", "o", "gate_up", "down"):
                w = layer[name]
                module = "self_attn" if name in ("qkv", "o") else "mlp"
                prefetch.loaded(f"model.layers.{i}.{module}.{name}_proj", None if isinstance(w, tuple) else w.wq,
                                tensors(w), int(budget_mb * 2**20))
        return sum(1 for layer in layers if prefetch.table_ptr(layer["qkv"].wq))

    sleep_only = graph_us(lambda: [torch.cuda._sleep(cycles) for _ in layers])
    bandwidth = copy_bandwidth() / 1e9
    weight_mb = sum(t.numel() * t.element_size() for t in (x for w in layers[0].values() for x in tensors(w))) / 2**20
    rows = []
    for m in [int(v) for v in args.ms.split(",")]:
        x = torch.randn(m, 4096, dtype=torch.bfloat16, device="cuda")
        outs: list = [None] * args.layers
        bf16_us = graph_us(functools.partial(bf16_step, x, outs))
        plain = None
        budgets = [float(v) for v in args.budgets.split(",")]
        for budget in [0.0, *(b for b in budgets if b != 0)]:  # the plain build first: the outputs' reference
            linked = link(budget)
            step_us = graph_us(functools.partial(trit_step, x, outs))
            got = torch.stack([o.float() for o in outs])
            if plain is None:
                plain = got
            err = float((got - plain).abs().max() / plain.abs().max())
            rows.append({"m": m, "budget_mb": budget, "sources_linked": linked, "step_us": step_us,
                         "linears_us": step_us - sleep_only, "bf16_step_us": bf16_us,
                         "bf16_linears_us": bf16_us - sleep_only, "max_rel_diff_vs_plain": err})
            print(f"M={m:<3} budget {budget:5.1f} MB ({linked} linked): step {step_us:8.1f} us, linears "
                  f"{step_us - sleep_only:8.1f} us (bf16 {bf16_us - sleep_only:8.1f}), diff {err:.1e}", flush=True)
    prefetch.reset()
    result = {"command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "device": torch.cuda.get_device_name(), "l2_mb": torch.cuda.get_device_properties(0).L2_cache_size / 2**20,
              "copy_gbs": bandwidth, "gap_us": args.gap_us, "sleep_only_us": sleep_only, "layers": args.layers,
              "trit_weights_mb_a_layer": weight_mb, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "versions": {"torch": torch.__version__}, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
