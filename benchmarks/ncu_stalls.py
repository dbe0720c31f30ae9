"""Read an ncu report's CSV pages: where each kernel's warps stall, and its executed instruction mix.

``python benchmarks/ncu_stalls.py stalls RAW.csv``: the raw page (``ncu --import R --page raw --csv``), each
kernel's warp-state samples by stall reason (the SourceCounters section samples them).
``python benchmarks/ncu_stalls.py mix SOURCE.csv[.gz]``: the source page (``ncu --import R --page source --csv
--print-source sass``), each kernel's executed warp instructions by opcode, with their stall samples.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import sys
from collections import Counter


def stalls(path: str, top: int = 10) -> str:
    rows = list(csv.reader(open(path)))
    head, data = rows[0], rows[2:]  # the second row holds the units
    out = []
    for r in data:
        vals = {}
        for h, v in zip(head, r, strict=False):
            if "smsp__pcsamp_warps_issue_stalled" in h and not h.endswith("_not_issued"):
                try:
                    vals[h.replace("smsp__pcsamp_warps_issue_stalled_", "")] = float(v.replace(",", ""))
                except ValueError:
                    pass
        total = sum(vals.values()) or 1.0
        dur = r[head.index("gpu__time_duration.sum")] if "gpu__time_duration.sum" in head else "?"
        out.append(f"{r[head.index('Kernel Name')][:90]} duration {dur}")
        out += [f"   {v / total:6.1%}  {h}" for v, h in sorted(((v, h) for h, v in vals.items()), reverse=True)[:top]]
    return "\n".join(out)


def mix(path: str, top: int = 22) -> str:
    text = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read()
    out = []
    for block in re.split(r'^"Kernel Name",', text, flags=re.M)[1:]:
        name, body = block.split("\n", 1)
        rows = list(csv.reader(io.StringIO(body)))
        head = rows[0]
        ie, src = head.index("Instructions Executed"), head.index("Source")
        samp = head.index("Warp Stall Sampling (All Samples)")
        ops, samples, total = Counter(), Counter(), 0
        for r in rows[1:]:
            if len(r) <= ie:
                continue
            words = r[src].split()
            op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "?")
            op = op.split(".")[0]
            n = int(r[ie] or 0)
            total += n
            ops[op] += n
            samples[op] += int(r[samp] or 0)
        out.append(f"{name[:100]}: {total} warp instructions executed")
        out += [f"   {op:12s} {n:10d} {n / total:6.1%}  stall samples {samples[op]}" for op, n in ops.most_common(top)]
    return "\n".join(out)


if __name__ == "__main__":
    print({"stalls": stalls, "mix": mix}[sys.argv[1]](sys.argv[2]))
