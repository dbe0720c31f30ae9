"""Data-free calibration's sampling speed by batch: SmolLM2-135M samples windows at two batch sizes, timed.

    PYTHONPATH=src python benchmarks/calib_sampling_time.py --out benchmarks/results/calib_sampling_time_cpu.json \
        [--device cpu] [--seq-len 129] [--runs 8:16,64:64]

Each run (``batch:windows``) times ``trit.calibrate.sample_from_model`` on the float model, as ``trit quantize``'s
data-free calibration calls it (seed 0, first tokens at random), and records seconds a window.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq-len", type=int, default=129)
    ap.add_argument("--runs", default="8:16,64:64", help="batch:windows pairs, comma-separated")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trit import smollm2
    from trit.calibrate import sample_from_model

    path = smollm2.float_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    result = {"command": " ".join(["benchmarks/calib_sampling_time.py", *sys.argv[1:]]), "model": smollm2.MODEL_NAME,
              "device": args.device, "host": platform.processor() or platform.machine(), "torch": torch.__version__,
              "seq_len": args.seq_len, "runs": []}
    for run in args.runs.split(","):
        batch, windows = (int(v) for v in run.split(":"))
        t = time.perf_counter()
        sample_from_model(model, tokenizer, windows, args.seq_len, 0, batch)
        seconds = time.perf_counter() - t
        row = {"batch": batch, "windows": windows, "seconds": seconds, "seconds_a_window": seconds / windows}
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
