"""Heal stability on the CPU: held-out KL over the steps for a few heal settings, from one GPTQ checkpoint.

    PYTHONPATH=src python benchmarks/results/ptq-experiments/heal_stability.py --ckpt CKPT --teacher MODEL \\
        --out heal_stability_cpu.json

CKPT is a one-plane trit checkpoint (here `trit quantize MODEL CKPT --method gptq --group-size 64 --act-order
--calib CALIB` with CALIB the second half of the WikiText-2 test file, as `benchmarks/ptq_smollm2.py` makes
it). Each setting trains on windows of the same calibration text and is scored on held-out windows from its
tail (`trit heal --data`); the perplexity of the student it writes is measured as in `ptq_smollm2.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

WIKITEXT = Path(__file__).resolve().parents[4] / "shared" / "data" / "wikitext-2-raw-test.txt"
SETTINGS = {  # name: (lr, freeze_codes)
    "all-1e-4": (1e-4, False),
    "all-2e-5": (2e-5, False),
    "scales-1e-4": (1e-4, True),
    "scales-1e-3": (1e-3, True),
    "all-1e-4-scale-grad": (1e-4, False),  # run with the scale learning through t * a (see the README)
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--teacher", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()

    from trit import runtime
    from trit.eval.overlap import check_disjoint
    from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_file
    from trit.heal import HealOptions, heal

    text = WIKITEXT.read_text()
    work = Path(tempfile.mkdtemp(prefix="heal-"))
    data = work / "calib.txt"
    data.write_text(text[len(text) // 2:])
    ppl_opts = PerplexityOptions()
    teacher = runtime.load(args.teacher, device="cpu")
    eval_ids = tokenize_file(teacher, WIKITEXT)
    eval_tokens = eval_ids[: ppl_opts.seq_len * ppl_opts.max_windows]
    rows = []
    for name in args.settings.split(","):
        lr, freeze = SETTINGS[name]
        opts = HealOptions(steps=args.steps, lr=lr, weight_lr=lr, batch=args.batch, seq_len=args.seq_len, data=data,
                           eval_every=10, device="cpu", freeze_codes=freeze, scales_first=0)
        start = time.perf_counter()
        report = heal(args.ckpt, args.teacher, work / name, opts, progress=False)
        check_disjoint(report.train_windows, eval_tokens, "heal training windows")
        ppl = perplexity(runtime.load(work / name, device="cpu"), eval_ids, ppl_opts, progress=False).perplexity
        rows.append({"setting": name, "lr": lr, "freeze_codes": freeze, "perplexity": ppl,
                     "heldout_kl": report.heldout, "seconds": time.perf_counter() - start})
        print(f"{name}: perplexity {ppl:.1f}, held-out KL {[round(v, 3) for _, v in report.heldout]}", flush=True)
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "steps": args.steps, "batch": args.batch,
                                        "seq_len": args.seq_len, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
