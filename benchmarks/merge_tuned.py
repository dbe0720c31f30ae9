"""Merge a partial tuned table (``trit bench kernels --quick --tuned-out``) into a full one.

    python benchmarks/merge_tuned.py src/trit/kernels/tuned/h200.json $OUT/h200_quick.json \
        src/trit/kernels/tuned/h200.json

Every problem the partial table holds (its configs and its kernel choice)
replaces the full table's entry; the rest stays. The merged table's command
records both runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(full: dict, part: dict) -> dict:
    if part["device"] != full["device"]:
        raise SystemExit(f"tables from different devices: {full['device']} and {part['device']}")
    out = {"device": full["device"], "command": f"{full['command']}; then, for the problems it holds: {part['command']}",
           "configs": {k: dict(v) for k, v in full["configs"].items()}, "choice": dict(full["choice"])}
    for kernel, entries in part["configs"].items():
        out["configs"].setdefault(kernel, {}).update(entries)
    out["choice"].update(part["choice"])
    return out


def main() -> int:
    full_path, part_path, out_path = (Path(a) for a in sys.argv[1:4])
    merged = merge(json.loads(full_path.read_text()), json.loads(part_path.read_text()))
    out_path.write_text(json.dumps(merged, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
