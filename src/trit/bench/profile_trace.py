"""Where the GPU waits inside a prefill step: the torch profiler's trace (Kineto's Chrome trace), read back.

vLLM's torch profiler writes, beside its summary table, one trace a worker
(``*.pt.trace.json.gz``): every kernel with its start and length on the GPU,
every CUDA launch and CPU op with theirs on the host, a correlation id tying
each kernel to its launch, and vLLM's step annotations on both sides. The
table (:mod:`trit.bench.profile_table`) says how long a step spanned on the
GPU and how much kernel time it held; :func:`step_gaps` says what the GPU was
waiting for between: for the step that prefilled the most tokens, the time no
kernel ran, each idle stretch charged to the host op that launched the kernel
ending it (the innermost CPU op around that launch, and the chain of ops
around it), and the host time of each op inside the step.

    python -m trit.bench.profile_trace TRACE.pt.trace.json.gz   # the summary of one trace, as JSON
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

from trit.bench.profile_table import prefill_tokens

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def load(path: Path) -> list[dict]:
    """The complete events (``ph`` X) of a trace file, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _chain(ops: list[dict], starts: list[float], ts: float) -> list[str]:
    """The names of the CPU ops that contain time ``ts`` (``ops`` of one thread, sorted by start), outermost
    first."""
    out = []
    for e in ops[:bisect.bisect_right(starts, ts)]:
        if e["ts"] <= ts <= e["ts"] + e["dur"]:
            out.append(e["name"])
    return out


def step_gaps(events: list[dict], min_gap_us: float = 1.0, top: int = 12) -> dict | None:
    """For the GPU step annotation that prefilled the most tokens: its span, its kernel time, the idle time
    between kernels (stretches of ``min_gap_us`` or more), that idle time by the innermost host op around the
    launch of the kernel that ended each stretch and by the three innermost ops of that chain, and the host
    time of each CPU op in the step (the CPU's own annotation of it; an op's time includes the ops inside
    it). None where the trace holds no prefill step."""
    prefills = [(prefill_tokens(e["name"]), e) for e in events if e.get("cat") == "gpu_user_annotation"]
    prefills = [(tokens, e) for tokens, e in prefills if tokens is not None]
    if not prefills:
        return None
    tokens, step = max(prefills, key=lambda p: (p[0], p[1]["dur"]))
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS and t0 <= e["ts"] <= t1), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    host = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == step["name"]]
    # the host's side of the step (its own annotation; else the second before the GPU's end): the CPU ops in it
    h0, h1 = (host[0]["ts"], host[0]["ts"] + host[0]["dur"]) if host else (t1 - 1e6, t1)
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e["ts"] <= h1 and e["ts"] + e["dur"] >= h0:
            by_thread[(e["pid"], e["tid"])].append(e)
    starts = {}
    for key, ops in by_thread.items():
        ops.sort(key=lambda e: e["ts"])
        starts[key] = [e["ts"] for e in ops]

    busy, idle, end = 0.0, 0.0, t0
    by_op: dict[str, float] = defaultdict(float)
    by_chain: dict[str, float] = defaultdict(float)
    for e in device:
        gap = e["ts"] - end
        if gap >= min_gap_us:
            idle += gap
            launch = launches.get(e.get("args", {}).get("correlation"))
            chain = []
            if launch is not None:
                key = (launch["pid"], launch["tid"])
                chain = _chain(by_thread.get(key, []), starts.get(key, []), launch["ts"])
            by_op[chain[-1] if chain else "(no host op found)"] += gap
            by_chain[" > ".join(chain[-3:]) if chain else "(no host op found)"] += gap
        busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
        end = max(end, e["ts"] + e["dur"])

    host_ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    if host:
        for ops in by_thread.values():
            for e in ops:
                if h0 <= e["ts"] <= h1:
                    host_ops[e["name"]][0] += e["dur"]
                    host_ops[e["name"]][1] += 1

    def ranked(d: dict[str, float]) -> dict[str, float]:
        return dict(sorted(d.items(), key=lambda kv: -kv[1])[:top])

    return {"step": step["name"], "context_tokens": tokens, "span_us": step["dur"], "kernel_us": busy,
            "idle_us": idle, "idle_by_launching_op_us": ranked(by_op), "idle_by_op_chain_us": ranked(by_chain),
            "host_step_us": host[0]["dur"] if host else None,
            "host_ops_us": {name: {"us": v[0], "calls": v[1]}
                            for name, v in sorted(host_ops.items(), key=lambda kv: -kv[1][0])[:top]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trit.bench.profile_trace",
                                 description="Where the GPU waits inside the largest prefill step of a torch "
                                             "profiler trace (vLLM's *.pt.trace.json.gz).")
    ap.add_argument("trace", type=Path)
    ap.add_argument("--min-gap-us", type=float, default=1.0, help="idle stretches shorter than this are not counted")
    args = ap.parse_args(argv)
    print(json.dumps(step_gaps(load(args.trace), args.min_gap_us), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
