"""GPTQ output error layer by layer on SmolLM2's real Hessians: one, two and three rounding passes.

Needs the float SmolLM2 checkpoint in ``$TRIT_CACHE`` (``trit demo`` or ``smollm2.float_checkpoint()`` makes it).
From the repository root:

    PYTHONPATH=src python benchmarks/results/ptq-experiments/passes.py 2 > benchmarks/results/ptq-experiments/passes.log
    PYTHONPATH=src python benchmarks/results/ptq-experiments/passes.py 2 no-act-order \
        > benchmarks/results/ptq-experiments/passes_no_act_order.log

For each linear layer of the first N decoder layers (calibration: 16 x 512 tokens of the second half of the
WikiText-2 test file, inputs propagated through the already quantized layers and aimed at the float model's
outputs, as ``trit quantize --method gptq --act-order`` does; without act-order when asked), it prints ``tr((W-Q) H (W-Q)^T) / tr(W H W^T)``
after 1, 2 and 3 passes (``GptqOptions.passes``), then the geometric mean of each over the layers.
"""

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

from trit import calibrate
from trit import format as fmt
from trit.checkpoint import open_checkpoint
from trit.quant.gptq import GptqOptions, dequantize_planes, float_target_weight, gptq_ternary, output_error
from trit.smollm2 import cache_dir

LAYERS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ACT_ORDER = "no-act-order" not in sys.argv[2:]
TEXT = Path(__file__).resolve().parents[4] / "shared" / "data" / "wikitext-2-raw-test.txt"
_quantize = calibrate._quantize_linear
rows: list[dict] = []


class Enough(Exception):
    pass


def probe(lin, h, gopts, cross=None):
    n, k = lin.weight.shape
    k_pad = fmt.padded_k(k, gopts.group_size)
    w = fmt.pad_k(lin.weight.float(), k_pad)
    hp = torch.zeros(k_pad, k_pad)
    hp[:k, :k] = h
    if cross is not None:
        cp = torch.zeros_like(hp)
        cp[:k, :k] = cross
        w = float_target_weight(w, hp, cp, gopts.damp)
    base = output_error(w, torch.zeros_like(w), hp)
    errs = {}
    for passes in (1, 2, 3):
        codes, scales = gptq_ternary(w, hp, dataclasses.replace(gopts, passes=passes))
        errs[passes] = output_error(w, dequantize_planes(codes.float(), scales), hp) / base
    rows.append(errs)
    print((n, k), " ".join(f"passes={a}: {v:.4f}" for a, v in errs.items()), flush=True)
    if len(rows) >= 7 * LAYERS:
        raise Enough
    return _quantize(lin, h, gopts, cross)


def main() -> None:
    calibrate._quantize_linear = probe
    ckpt = open_checkpoint(cache_dir() / "SmolLM2-135M-Instruct")
    text = TEXT.read_text()
    calib = Path("/tmp/passes_calib.txt")
    calib.write_text(text[len(text) // 2:])
    todo = {name.rsplit(".", 1)[0] for name in ckpt.tensors if name.endswith("_proj.weight")}
    start = time.time()
    try:
        calibrate.gptq_model(ckpt, todo, GptqOptions(64, 1, 0.01, ACT_ORDER), calibrate.CalibOptions(calib, 16, 512),
                             "cpu", False)
    except Enough:
        pass
    for key in rows[0]:
        print(f"passes={key} geo-mean rel err", math.exp(sum(math.log(r[key]) for r in rows) / len(rows)))
    print("seconds", time.time() - start)


if __name__ == "__main__":
    main()
