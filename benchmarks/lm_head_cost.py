"""What an 8-bit lm_head would cost in perplexity: the output layer rounded to int8 or fp8 (e4m3), one scale a row.

    PYTHONPATH=src python benchmarks/lm_head_cost.py CKPT [CKPT ...] --out lm_head_cost.json

For a decode step of a ternary model the lm_head is a large share of the bytes
read (SmolLM2-135M: its 49152 x 576 head in bf16 is more than all the ternary
layers together; Llama-3-8B: about a third), so an 8-bit head is the next
thing to shrink. Before building it into the runtime and the vLLM plugin, this
measures its cost: each checkpoint (float or trit) is loaded as ``trit eval``
loads it, its lm_head (untied from the embeddings, which stay as they are) is
replaced by the weight rounded to 8 bits and back (``int8``: symmetric, scale
``max|w| / 127`` a row, round half to even; ``fp8``: ``max|w| / 448`` a row,
cast to ``float8_e4m3fn``), and perplexity is measured on the same windows as
``trit eval --ppl wikitext2,gsm8k,python`` (first 16 windows of 512 tokens).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

HEADS = ("as stored", "int8", "fp8")


def round_head(w: torch.Tensor, kind: str) -> torch.Tensor:
    """``w`` (V, H) rounded to ``kind`` with one scale a row, and back to its dtype (``as stored``: unchanged)."""
    if kind == "as stored":
        return w.clone()
    if kind == "int8":  # the rounding the runtime and the vLLM plugin serve (trit.kernels.int8_rows)
        from trit.kernels import int8_rows

        return int8_rows.dequantize_rows(*int8_rows.quantize_rows(w), w.dtype)
    wf = w.float()
    amax = wf.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    if kind == "fp8":
        s = amax / 448
        return ((wf / s).to(torch.float8_e4m3fn).float() * s).to(w.dtype)
    raise ValueError(f"unknown lm_head kind {kind!r}; expected one of {', '.join(HEADS)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpts", nargs="+", type=Path)
    ap.add_argument("--corpora", default="wikitext2,gsm8k,python")
    ap.add_argument("--max-windows", type=int, default=16)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from trit import runtime
    from trit.eval.perplexity import PerplexityOptions, geometric_mean, perplexities

    result = {"command": "PYTHONPATH=src python benchmarks/lm_head_cost.py " + " ".join(sys.argv[1:]),
              "host": platform.machine(), "torch": torch.__version__, "rows": []}
    opts = PerplexityOptions(max_windows=args.max_windows)
    for ckpt in args.ckpts:
        loaded = runtime.load(ckpt, lm_head="stored")  # the head as stored, whatever the checkpoint asks
        head = loaded.model.get_output_embeddings()
        stored = head.weight.detach().clone()
        for kind in HEADS:
            head.weight = torch.nn.Parameter(round_head(stored, kind), requires_grad=False)  # untied
            ppl = {k: v.perplexity for k, v in perplexities(loaded, args.corpora.split(","), opts, False).items()}
            row = {"checkpoint": ckpt.name, "lm_head": kind, "perplexity": ppl,
                   "geometric_mean": geometric_mean(list(ppl.values()))}
            result["rows"].append(row)
            print(f"{ckpt.name:24} {kind:10} " + "  ".join(f"{k} {v:.3f}" for k, v in ppl.items())
                  + f"  geo. mean {row['geometric_mean']:.3f}", flush=True)
        del loaded
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
