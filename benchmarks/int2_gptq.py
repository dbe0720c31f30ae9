"""int2 at the bits of one trit-plane, for the quality table's same-bits comparison: trit's GPTQ on the asymmetric
int2 grid (four levels ``scale * ({0, 1, 2, 3} - zero)``, a scale and a zero point a group of 64: what int2 GPTQ
tools and Humming's int2 serve, 2.25 bits a weight with an fp16 scale and the zero point beside it), with the
calibration, rotation and float target of the one-plane ternary recipe it is compared with.

    PYTHONPATH=src python benchmarks/int2_gptq.py MODEL_DIR OUT_DIR [--group-size 64] [--calib FILE|CORPUS]
        [--calib-samples 128] [--device cpu]

trit has no int2 format or kernel: OUT_DIR is a float32 checkpoint of the dequantized weights (the int2 values
exactly), for scoring only; ``int2_gptq.json`` beside it records the recipe and the bits a weight.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--calib", default=None, help="a text file or built-in corpus (default: data-free)")
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from trit.arch import check_float_source, is_decoder_linear, open_float_source
    from trit.calibrate import gptq_model
    from trit.checkpoint import write_checkpoint
    from trit.configs import CalibConfig
    from trit.quant.gptq import GptqOptions, dequantize
    from trit.quant.rotate import rotated_config
    from trit.rotation import choose_rotation, rotation_maps

    ckpt = open_float_source(args.model_dir, args.out_dir, False)
    check_float_source(ckpt)
    shapes = {name.removesuffix(".weight"): tuple(info.shape) for name, info in ckpt.tensors.items()
              if name.endswith(".weight") and is_decoder_linear(name.removesuffix(".weight"))}
    # the one-plane ternary recipe's settings (float target, act-order), on an integer grid with zero points;
    # one rounding pass: the later passes refit least-squares scales, which a zero-point grid does not take
    opts = GptqOptions(args.group_size, int_bits=2, zero_point=True, refit=False, passes=1, float_target=True)
    calib = CalibConfig(args.calib, samples=args.calib_samples)
    start = time.perf_counter()
    with ExitStack() as stack:
        rotation = choose_rotation(ckpt, True, True)
        rotate, rotate_for_calibration = rotation_maps(ckpt, rotation, stack, device=args.device)
        results = gptq_model(ckpt, set(shapes), opts, calib, args.device, True, rotate_for_calibration)

        def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
            module, leaf = name.rsplit(".", 1)
            if leaf != "weight" or module not in results:
                return {n: t.float().contiguous() for n, t in rotate(name, tensor).items()}
            codes, scales = results.pop(module)  # (1, N, K_pad) in 0..3; (2, N, G): scales, zero points
            assert 0 <= int(codes.min()) and int(codes.max()) <= 3, f"{module}: codes outside 0..3"
            return {name: dequantize(codes, scales, opts)[:, :shapes[module][1]].contiguous()}

        config = rotated_config(dict(ckpt.config, torch_dtype="float32"))
        write_checkpoint(ckpt, args.out_dir, transform, config, True, desc="int2")
    weights = sum(n * k for n, k in shapes.values())
    groups = sum(n * -(-k // args.group_size) for n, k in shapes.values())
    (args.out_dir / "int2_gptq.json").write_text(json.dumps({
        "recipe": "GPTQ, asymmetric int2, a scale and a zero point a group; rotated; float target; act-order; "
                  "one pass", "group_size": args.group_size, "calib": args.calib, "calib_samples": args.calib_samples,
        # codes at 2 bits, an fp16 scale and a 2-bit zero point a group
        "bits_per_weight": (2 * weights + (16 + 2) * groups) / weights, "seconds": time.perf_counter() - start},
        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
