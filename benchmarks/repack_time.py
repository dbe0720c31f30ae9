"""What the load-time repack to the mma layout adds to loading a whole model, on the GPU.

    PYTHONPATH=src python benchmarks/repack_time.py --models llama3-8b,27b --out $OUT/repack.json

For each model shape it builds the ternary model with random weights on the
GPU in format v1 (``trit.synthetic.random_model(..., prepare=False)``, no
checkpoint read), then times :func:`trit.nn.prepare` on it as the loader runs it
(every layer that ``TRIT_LAYOUT``'s rule admits is repacked, in place of its
format-v1 buffers), synchronised, twice, each on a fresh model (the
process's first call also pays CUDA's one-time setup of the kernels the
repack's PyTorch ops use; later shapes in the same process do not). It
records the seconds, the layers and weights repacked, the allocated memory
before and after and the peak during the repack. The vLLM plugin repacks
with the same function, one layer at a time, in
``process_weights_after_loading``, but on vLLM's merged layers (qkv as one,
gate and up as one), so the size rule (``trit.linear.TILE_MIN_WEIGHTS``) can admit
a larger set there than here (the results file was made under the 40 Mi rule:
the 27B shape's merged qkv, 44M weights, was repacked there and not here).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from trit.bench.decode import SHAPES, hf_config, trit_config
from trit.nn import TritLinear, prepare
from trit.synthetic import random_model


def one(shape: str) -> dict:
    model = random_model(hf_config(shape), trit_config(), "cuda", torch.bfloat16, prepare=False)
    layers = [m for m in model.modules() if isinstance(m, TritLinear)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    done, why = prepare(model, torch.bfloat16)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    res = dict(
        seconds=seconds, layers=len(layers), layers_repacked=done, refusal_of_the_others=why,
        weights_repacked=sum(m.in_features * m.out_features for m in layers if m.layout == "mma"),
        weights_ternary=sum(m.in_features * m.out_features for m in layers),
        allocated_gib_before=before / 2**30, allocated_gib_after=torch.cuda.memory_allocated() / 2**30,
        peak_gib_during=torch.cuda.max_memory_allocated() / 2**30,
    )
    del model, layers
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama3-8b,27b", help=f"shapes, comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = dict(command="PYTHONPATH=src python " + " ".join(sys.argv), device=torch.cuda.get_device_name(),
                  torch=torch.__version__, layout_rule=os.environ.get("TRIT_LAYOUT", "auto"), runs={})
    for shape in args.models.split(","):
        runs = [one(shape) for _ in range(2)]
        result["runs"][shape] = runs
        for i, r in enumerate(runs):
            print(f"{shape} call {i + 1}: {r['seconds']:.3f} s, {r['layers_repacked']}/{r['layers']} layers, "
                  f"{r['weights_repacked'] / 1e9:.2f}/{r['weights_ternary'] / 1e9:.2f} G weights, allocated "
                  f"{r['allocated_gib_before']:.2f} -> {r['allocated_gib_after']:.2f} GiB, "
                  f"peak {r['peak_gib_during']:.2f} GiB", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
