"""llm-compressor's own W4A8 (its ``oneshot`` with ``GPTQModifier``) on the calibration windows trit used, for the
quality table's same-bits comparison. It runs in an environment of its own (llm-compressor pins its own
transformers and compressed-tensors; ``make .venv-llmcompressor`` makes it) and imports nothing of trit:

    .venv-llmcompressor/bin/python benchmarks/llmcompressor_w4a8.py MODEL_DIR IDS.pt OUT_DIR [--group-size 64]

``IDS.pt``: the calibration windows, an ``(S, T)`` int64 tensor (``benchmarks/quality_domains.py`` writes the ones
trit's variant used). The scheme is vLLM's W4A8 int scheme, as trit's ``--scheme w4a8`` writes it: int4 weights,
symmetric, static, one scale a group; int8 activations, symmetric, dynamic, one scale a token; ``lm_head`` left in
float. Everything else is llm-compressor's default (its GPTQ dampening, activation order, no rotation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("ids", type=Path, help="calibration windows: an (S, T) int64 tensor saved by torch.save")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--group-size", type=int, default=64)
    args = ap.parse_args()

    import torch
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = torch.load(args.ids)
    if ids.dim() != 2:
        sys.exit(f"{args.ids}: expected an (S, T) tensor of token ids, found shape {tuple(ids.shape)}")
    data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=args.group_size,
                                 dynamic=False),
        input_activations=QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True),
    )
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    start = time.perf_counter()
    oneshot(model=model, tokenizer=tokenizer, dataset=data, num_calibration_samples=ids.shape[0],
            max_seq_length=ids.shape[1], shuffle_calibration_samples=False,
            recipe=GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    seconds = time.perf_counter() - start
    model.save_pretrained(args.out_dir, save_compressed=True)
    tokenizer.save_pretrained(args.out_dir)
    import compressed_tensors
    import llmcompressor
    (args.out_dir / "llmcompressor_run.json").write_text(json.dumps(
        {"llmcompressor": llmcompressor.__version__, "compressed_tensors": compressed_tensors.__version__,
         "torch": torch.__version__, "calibration_windows": list(ids.shape), "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
