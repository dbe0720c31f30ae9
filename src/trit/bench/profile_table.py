"""The torch profiler's summary table (``key_averages().table()``), as vLLM's profiler writes it, read back.

vLLM's torch profiler (``--profiler-config '{"profiler": "torch", ...}'``) writes
one text table per worker when a profile stops (``profiler_out_0.txt`` in vLLM
0.25, ``<worker>.profiler_out.txt`` in 0.32): one row an op or kernel, with its
self time on the CPU and, where a GPU was profiled, on the device, and its
calls. :func:`parse` turns it into numbers; :func:`summarize` adds them up by
what the time went to (trit's kernels, attention, matrix multiplies, the rest),
the figures ``trit bench serve --profile`` records.

In a GPU table three kinds of row carry device time: kernels (and memcpy /
memset), with no CPU time of their own; CPU ops and runtime calls
(``aten::mm``, ``cudaGraphLaunch``), whose device column repeats the time of
the kernels they launched; and vLLM's step annotations
(``execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>)``),
whose device time is a step's span on the GPU, first kernel to last. Only the
kernels add up to the table's total; the spans of decode-only steps give the
GPU time a step takes beside the kernel time in it, and the spans of the
steps that prefill (each its own row) how long those took on the GPU. The
CPU time of the linear layers' ops (``trit::*``, ``aten::mm``) says what their
calls cost the host, most of it outside CUDA graphs (in prefill steps).

    python -m trit.bench.profile_table serve.json   # the profile entries again, from the tables kept beside it
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
# what a kernel's time goes to, by its name (first match wins): trit's CUDA and Triton kernels, attention (before
# the GEMMs: FlashAttention 3's kernels are CUTLASS device kernels), dense matrix multiplies (cuBLAS, CUTLASS)
GROUPS = (
    ("trit", re.compile(r"trit_|trit::|_gemv_kernel|_skinny_kernel|_gemm_kernel|_gemm_a8_kernel|_mm_a8_kernel|_dequant_kernel"
                        r"|_codes_int8_kernel|_quantize_rows")),
    ("attention", re.compile(r"flash|attn|attention", re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)),
)
# vLLM's annotation of an engine step: requests (tokens) of context (prefill) and of generation (decode)
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def prefill_tokens(name: str) -> int | None:
    """The context tokens of a step annotation that prefills (one or more context requests); None for a
    decode-only step or a name that is no step."""
    m = STEP.fullmatch(name)
    return int(m.group(2)) if m and m.group(1) != "0" else None


def _time_us(cell: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)\s*(ns|us|ms|s)", cell.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def parse(text: str) -> dict:
    """``{"rows": [{"name", "self_cpu_us", "self_device_us", "calls"}], "self_cpu_total_us",
    "self_device_total_us"}`` from one table; device figures are None where only the CPU was profiled.

    The rows' columns are found from the dashed rule above the header (each run of dashes is one column), so
    names with spaces in them read whole."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*-+(\s+-+)+\s*", line)]
    if len(rules) < 2:
        raise ValueError("not a torch profiler table: no dashed rules around a header")
    spans = [m.span() for m in re.finditer(r"-+", lines[rules[0]])]
    # a header longer than its column ("CUDA time avg" in 12) overruns it: split the header on its gaps instead
    head = re.split(r"\s{2,}", lines[rules[0] + 1].strip())
    if len(head) != len(spans):
        raise ValueError(f"not a torch profiler table: {len(head)} headers for {len(spans)} columns")
    try:
        name_col, cpu_col, calls_col = head.index("Name"), head.index("Self CPU"), head.index("# of Calls")
    except ValueError as e:
        raise ValueError(f"not a torch profiler table: header {head}") from e
    cpu_total_col = head.index("CPU total") if "CPU total" in head else None
    device_col = next((i for i, h in enumerate(head) if h.startswith("Self ") and not h.endswith("%")
                       and h != "Self CPU"), None)
    end = rules[2] if len(rules) > 2 else len(lines)
    rows = []
    for line in lines[rules[1] + 1:end]:
        cells = [line[a:b].strip() for a, b in spans]
        if not cells[name_col]:
            continue
        rows.append({"name": cells[name_col], "self_cpu_us": _time_us(cells[cpu_col]),
                     "cpu_total_us": None if cpu_total_col is None else _time_us(cells[cpu_total_col]),
                     "self_device_us": None if device_col is None else _time_us(cells[device_col]),
                     "calls": int(cells[calls_col]) if cells[calls_col].isdigit() else None})
    totals = {}
    for line in lines[end:]:
        m = re.match(r"Self (\S+) time total:\s*(.+)$", line.strip())
        if m:
            totals["self_cpu_total_us" if m.group(1) == "CPU" else "self_device_total_us"] = _time_us(m.group(2))
    return {"rows": rows, "self_cpu_total_us": totals.get("self_cpu_total_us"),
            "self_device_total_us": totals.get("self_device_total_us")}


# the CPU ops of the linear layers whose host time a summary reports: trit's, and the dense GEMM bf16 runs
LINEAR_OPS = re.compile(r"trit::\w+|aten::(mm|addmm|linear)")


def group(name: str) -> str:
    """What a kernel's time goes to (:data:`GROUPS`), ``other`` where no group names it."""
    return next((g for g, pattern in GROUPS if pattern.search(name)), "other")


def summarize(table: dict, steps: int, top: int = 25) -> dict:
    """Device time (or CPU time, where no device was profiled) by group and a step, and the ``top`` rows; on a
    device, also the mean GPU span of a decode-only step (``decode_step_span_us``, over ``decode_steps``), from
    vLLM's step annotations.

    ``steps``: the engine steps the profile covered (for a decode-bound run, output tokens over concurrency)."""
    device = table["self_device_total_us"] is not None
    key = "self_device_us" if device else "self_cpu_us"
    total = table["self_device_total_us"] if device else table["self_cpu_total_us"]
    spans = [(STEP.fullmatch(r["name"]), r) for r in table["rows"] if device and r[key]]
    decode = [r for m, r in spans if m and m.group(1) == "0" and r["calls"]]
    # on a device: kernels only (a CPU op's device column repeats its kernels' time; an annotation is a span)
    kernels = [r for r in table["rows"] if r[key] and not (device and (r["self_cpu_us"] or STEP.fullmatch(r["name"])))]
    by_group: dict[str, float] = {}
    for r in kernels:
        by_group[group(r["name"])] = by_group.get(group(r["name"]), 0.0) + r[key]
    listed = sum(by_group.values())
    # rows past the table's row limit; the total is printed to 4 digits, so a smaller difference is its rounding
    if total is not None and total - listed > 2e-3 * total:
        by_group["not listed"] = total - listed
    per_step = 1 / max(steps, 1)
    decode_steps = sum(r["calls"] for r in decode)
    prefill = [{"step": r["name"], "context_tokens": tokens, "span_us": r[key], "calls": r["calls"]}
               for _, r in spans if (tokens := prefill_tokens(r["name"])) is not None]
    ops = {r["name"]: {"cpu_total_us": r["cpu_total_us"], "calls": r["calls"]} for r in table["rows"]
           if LINEAR_OPS.fullmatch(r["name"]) and r.get("cpu_total_us") is not None}
    return {"clock": "device" if device else "cpu", "steps": steps,
            "total_us": total, "us_per_step": None if total is None else total * per_step,
            "us_per_step_by_group": {g: v * per_step for g, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
            "decode_steps": decode_steps,
            "decode_step_span_us": sum(r[key] for r in decode) / decode_steps if decode_steps else None,
            "prefill_step_spans": sorted(prefill, key=lambda p: -p["context_tokens"]),
            "linear_ops_cpu": dict(sorted(ops.items())),
            "top": sorted(kernels, key=lambda r: -r[key])[:top]}


def resummarize(result_path: Path) -> dict:
    """A ``trit bench serve`` JSON with each server's ``profile`` entry made again from the table kept beside it
    (the same steps), as this module reads tables now. Returns the result; the caller writes it."""
    result = json.loads(result_path.read_text())
    for server in result["servers"]:
        prof = server.get("profile") or {}
        if prof.get("table") and not prof.get("error"):
            table = parse((result_path.parent / prof["table"]).read_text(errors="replace"))
            server["profile"] = {**{k: prof[k] for k in ("concurrency", "prompts", "level")}, "table": prof["table"],
                                 **summarize(table, prof["steps"])}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trit.bench.profile_table",
                                 description="Make a trit bench serve JSON's profile entries again from the "
                                             "profiler tables kept beside it (in place).")
    ap.add_argument("results", type=Path, nargs="+", help="trit bench serve JSON files")
    for path in ap.parse_args(argv).results:
        path.write_text(json.dumps(resummarize(path), indent=1))
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
