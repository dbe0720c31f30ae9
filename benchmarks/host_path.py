"""Host time a call of the ternary ops against bf16 ``F.linear``, on the GPU: what a layer costs the CPU.

    PYTHONPATH=src python benchmarks/host_path.py --models llama3-8b --ms 1,16,512 --out $OUT/host.json

Inside a CUDA graph a call's host work is paid once, at capture; outside one
(the runtime's eager forward, vLLM's prefill above its largest captured size)
it is paid on every call, and where it exceeds the kernel's device time the
GPU waits for the CPU. For each layer shape and M this times the op a loaded
layer calls (``trit::linear_tiled`` where the layout rule repacks the layer,
else ``trit::linear``) and bf16 ``F.linear`` (cuBLAS) two ways:

- ``host_us``: the wall time of issuing ``--calls`` calls back to back while
  the GPU is held busy by a sleep kernel queued first, so that no call waits
  for the GPU, divided by the calls (median of ``--reps``). ``gpu_busy``
  records that the sleep had not finished when the last call returned (else
  the figure may include waiting);
- ``device_us``: a CUDA graph of one call replayed (one copy of the weights,
  L2-warm: a reference for which of the two is longer, not a bandwidth figure);
- ``trit_first_us``: the host time of the op's first call at this M (behind a
  sleep kernel too), after a call at M + 16 has compiled and loaded its
  kernels: what a server pays once for each new token count outside its
  graphs (the kernel choice and the launch plan worked out and kept).

``--activations int8 --group -1`` times the layers as a BitNet import holds
them (W1.58A8, one scale a row).

Run it under inference mode, as servers do.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from trit.bench.host import cpu_model


def host_us(fn, calls: int, reps: int, sleep_cycles: int) -> tuple[float, bool]:
    """Median over ``reps`` of the wall time of ``calls`` calls issued behind a sleep kernel, per call; and whether
    the GPU was still on the sleep when every rep's last call returned."""
    times, busy = [], True
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        slept = torch.cuda.Event()
        slept.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        busy = busy and not slept.query()
        torch.cuda.synchronize()
    return statistics.median(times), busy


def problem(n: int, k: int, m: int, args) -> dict:
    from trit.bench.kernels import layout_of, ternary_layer
    from trit.kernels import tuning
    from trit.kernels.cuda import mma as cmma

    group, a8 = args.group, args.activations == "int8"
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    packed, scale = ternary_layer(n, k, group)
    tiled = layout_of(n, k, x.device, a8, group) == "mma"
    if tiled:
        r = cmma.repack(packed, scale, group, k)
        op = "trit::linear_tiled"

        def trit_at(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops.trit.linear_tiled(rows, r.wq, r.sc, n, group, None, a8)
    else:
        op = "trit::linear"

        def trit_at(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops.trit.linear(rows, packed, scale, group, None, a8)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)

    def trit_call():
        return trit_at(x)

    def bf16_call():
        return torch.nn.functional.linear(x, w)

    out = {"op": op}
    # another M of the same divisibility by 16 (on which Triton specializes): compiles and loads the kernels
    trit_at(torch.randn(m + 16, k, device="cuda", dtype=torch.bfloat16))
    out["trit_first_us"], _ = host_us(trit_call, 1, 1, args.sleep_cycles)
    for name, fn in (("trit", trit_call), ("bf16", bf16_call)):
        for _ in range(3):  # compiles, loads, allocates
            fn()
        torch.cuda.synchronize()
        us, busy = host_us(fn, args.calls, args.reps, args.sleep_cycles)
        out[f"{name}_host_us"], out[f"{name}_gpu_busy"] = us, busy
        out[f"{name}_device_us"] = tuning.graph_time_us([fn])
    return out


def main(argv: list[str] | None = None) -> int:
    from trit.bench.kernels import GROUP, SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="llama3-8b", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--ms", default="1,16,512", help="rows a call (tokens), comma-separated")
    ap.add_argument("--calls", type=int, default=50, help="calls a timed rep")
    ap.add_argument("--reps", type=int, default=7, help="timed reps; the median is kept")
    ap.add_argument("--sleep-cycles", type=int, default=40_000_000,
                    help="GPU clock cycles the sleep kernel holds the GPU a rep (about 20 ms)")
    ap.add_argument("--activations", choices=("bf16", "int8"), default="bf16",
                    help="int8: rounded per token inside the op (W1.58A8)")
    ap.add_argument("--group", type=int, default=GROUP, help="inputs a weight scale, -1 one scale a row")
    ap.add_argument("--out", type=Path, required=True, help="the JSON written")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_path: needs a CUDA GPU", file=sys.stderr)
        return 2
    import trit.ops  # noqa: F401  (registers the ops)
    from trit.kernels import registry

    rows = []
    with torch.inference_mode():
        for model in args.models.split(","):
            for layer, n, k in SHAPES[model]:
                for m in (int(v) for v in args.ms.split(",")):
                    row = {"model": model, "layer": layer, "n": n, "k": k, "m": m, **problem(n, k, m, args)}
                    layout = "mma" if row["op"] == "trit::linear_tiled" else "v1"
                    p = registry.Problem(m, n, k, args.group, "cuda", torch.bfloat16,
                                         args.activations == "int8", layout)
                    row["kernel"] = registry.choose_kernel(p).kernel.name
                    rows.append(row)
                    print(f"{model:10} {layer:8} M={m:<5} {row['kernel']:20} trit host {row['trit_host_us']:6.1f} us "
                          f"(first at this M {row['trit_first_us']:7.1f}, device {row['trit_device_us']:7.1f})  "
                          f"bf16 host {row['bf16_host_us']:6.1f} us (device {row['bf16_device_us']:7.1f})",
                          flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "gpu_uuid": str(torch.cuda.get_device_properties(0).uuid),  # which machine: runs compare within one
        "cpu": cpu_model(),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "calls": args.calls, "reps": args.reps, "sleep_cycles": args.sleep_cycles,
        "activations": args.activations, "group_size": args.group,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
