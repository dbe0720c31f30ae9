"""The torch profiler's summary table (``key_averages().table()``), as vLLM's profiler writes it, read back.

vLLM's torch profiler (``--profiler-config '{"profiler": "torch", ...}'``) writes
one text table per worker when a profile stops (``profiler_out_0.txt`` in vLLM
0.25, ``<worker>.profiler_out.txt`` in 0.32): one row an op or kernel, with its
self time on the CPU and, where a GPU was profiled, on the device, and its
calls. :func:`parse` turns it into numbers; :func:`summarize` adds them up by
what the time went to (trit's kernels, matrix multiplies, attention, the rest),
the figures ``trit bench serve --profile`` records.
"""

from __future__ import annotations

import re

UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
# what a kernel's time goes to, by its name (first match wins): trit's CUDA and Triton kernels, dense matrix
# multiplies (cuBLAS, CUTLASS), attention
GROUPS = (
    ("trit", re.compile(r"trit_|trit::|_gemv_kernel|_skinny_kernel|_gemm_kernel|_gemm_a8_kernel|_mm_a8_kernel|_dequant_kernel"
                        r"|_codes_int8_kernel|_quantize_rows")),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)),
    ("attention", re.compile(r"flash|attn|attention", re.IGNORECASE)),
)


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
    device_col = next((i for i, h in enumerate(head) if h.startswith("Self ") and not h.endswith("%")
                       and h != "Self CPU"), None)
    end = rules[2] if len(rules) > 2 else len(lines)
    rows = []
    for line in lines[rules[1] + 1:end]:
        cells = [line[a:b].strip() for a, b in spans]
        if not cells[name_col]:
            continue
        rows.append({"name": cells[name_col], "self_cpu_us": _time_us(cells[cpu_col]),
                     "self_device_us": None if device_col is None else _time_us(cells[device_col]),
                     "calls": int(cells[calls_col]) if cells[calls_col].isdigit() else None})
    totals = {}
    for line in lines[end:]:
        m = re.match(r"Self (\S+) time total:\s*(.+)$", line.strip())
        if m:
            totals["self_cpu_total_us" if m.group(1) == "CPU" else "self_device_total_us"] = _time_us(m.group(2))
    return {"rows": rows, "self_cpu_total_us": totals.get("self_cpu_total_us"),
            "self_device_total_us": totals.get("self_device_total_us")}


def group(name: str) -> str:
    """What a kernel's time goes to (:data:`GROUPS`), ``other`` where no group names it."""
    return next((g for g, pattern in GROUPS if pattern.search(name)), "other")


def summarize(table: dict, steps: int, top: int = 25) -> dict:
    """Device time (or CPU time, where no device was profiled) by group and a step, and the ``top`` rows.

    ``steps``: the engine steps the profile covered (for a decode-bound run, output tokens over concurrency)."""
    key = "self_device_us" if table["self_device_total_us"] is not None else "self_cpu_us"
    total = table["self_device_total_us"] if key == "self_device_us" else table["self_cpu_total_us"]
    kernels = [r for r in table["rows"] if r[key]]
    by_group: dict[str, float] = {}
    for r in kernels:
        by_group[group(r["name"])] = by_group.get(group(r["name"]), 0.0) + r[key]
    listed = sum(by_group.values())
    if total is not None and total > listed:  # rows past the table's row limit
        by_group["not listed"] = total - listed
    per_step = 1 / max(steps, 1)
    return {"clock": "device" if key == "self_device_us" else "cpu", "steps": steps,
            "total_us": total, "us_per_step": None if total is None else total * per_step,
            "us_per_step_by_group": {g: v * per_step for g, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
            "top": sorted(kernels, key=lambda r: -r[key])[:top]}
