"""Quality away from WikiText: SmolLM2-135M made ternary (and W4A8) with trit's defaults, scored on three domains.

    PYTHONPATH=src python benchmarks/quality_domains.py --out benchmarks/results/quality_domains_cpu.json \
        [--variants bf16,absmean,gptq,gptq-2planes,w4a8-g64,w4a8-channel] [--device cpu] [--work DIR] \
        [--gsm8k-limit N [--gsm8k-variants bf16,gptq]] [--heal-sample-batch N] [--heal-no-grad-checkpointing]

A variant named ``BASE-a8`` (``A8``) scores BASE's checkpoint with int8 activations per token (W1.58A8). A variant in
``EXTERNAL`` is made by another tool (llm-compressor's W4A8, in its own environment: ``make .venv-llmcompressor``) on
the calibration windows of the trit variant it names, and scored by the same code.

Each variant is made the way a user makes it (the equivalent ``trit quantize``
command is in its row), with data-free calibration unless the variant names
a text; each is scored with ``trit eval --ppl wikitext2,gsm8k,python``'s code
(the first 16 windows of 512 tokens of each corpus's evaluation half), and the
geometric mean over the three is the figure recipes are chosen on. The
calibration windows a variant used are read back from the calibration cache
the quantize step wrote (or rebuilt: same seed, same model) and
checked to share no 32-token sequence with any corpus's evaluation windows
before a row is reported. Each row also records its size on disk and bits a
quantized weight (scales included). With ``--gsm8k-limit N`` the variants named
by ``--gsm8k-variants`` are also scored on the first N GSM8K problems, 5-shot,
through vLLM and lm-eval (``trit eval --gsm8k``'s code), on this machine's vLLM.
A healed variant (``HEALED``, e.g. ``--variants bf16,healed``) quantizes its
base variant as above (or reuses it from ``--work``), then runs ``trit heal``
with its defaults (data-free) but for the variant's own flags (``HEALED``),
``--heal-sample-batch`` and ``--heal-no-grad-checkpointing`` where given, and checks the heal's training
windows against every evaluation window too (its held-out windows, which pick
the student written, are not checked).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

CORPORA = ("wikitext2", "gsm8k", "python")
# name: the trit quantize flags (None: the float model)
VARIANTS = {
    "bf16": None,
    "absmean": ["--method", "absmean"],
    # the default recipe: one plane, residual stream rotated first, data-free, act-order, 3 passes, float target
    "gptq": ["--method", "gptq"],
    "gptq-32samples": ["--method", "gptq", "--calib-samples", "32"],  # the default before 128 windows
    "gptq-2planes": ["--method", "gptq", "--planes", "2"],
    # the rotation named explicitly: the same checkpoints as gptq, gptq-2planes and w4a8-g64 since it became their
    # default; kept because committed runs name their rows so
    "gptq-rotate": ["--method", "gptq", "--rotate"],
    "gptq-no-rotate": ["--method", "gptq", "--no-rotate"],
    "gptq-2planes-rotate": ["--method", "gptq", "--planes", "2", "--rotate"],
    "gptq-2planes-no-rotate": ["--method", "gptq", "--planes", "2", "--no-rotate"],
    "gptq-calib-python": ["--method", "gptq", "--calib", "python"],
    "gptq-128samples": ["--method", "gptq", "--calib-samples", "128"],
    "gptq-random-first": ["--method", "gptq", "--calib-first", "random"],
    "gptq-bos-first": ["--method", "gptq", "--calib-first", "bos"],  # the default before random first tokens
    "gptq-damp0.1": ["--method", "gptq", "--damp", "0.1"],  # ten times the default damping
    "gptq-damp0.001": ["--method", "gptq", "--damp", "0.001"],  # a tenth of it
    # one scale a row (as BitNet imports hold them): the scale granularity the int8 kernel runs fastest
    "gptq-row": ["--method", "gptq", "--group-size", "-1"],
    # int4 GPTQ weights, int8 per-token activations; the residual stream rotated first (the default)
    "w4a8-g64": ["--scheme", "w4a8", "--group-size", "64"],
    "w4a8-g64-no-rotate": ["--scheme", "w4a8", "--group-size", "64", "--no-rotate"],
    "w4a8-channel": ["--scheme", "w4a8", "--group-size", "channel"],
    "w4a8-g64-rotate": ["--scheme", "w4a8", "--group-size", "64", "--rotate"],  # as w4a8-g64 (see gptq-rotate)
    # trit demo's CPU recipes: 16 WikiText-2 windows, one pass
    "gptq-demo": ["--method", "gptq", "--calib", "wikitext2", "--calib-samples", "16", "--passes", "1"],
    "gptq-2planes-demo": ["--method", "gptq", "--planes", "2", "--calib", "wikitext2", "--calib-samples", "16",
                          "--passes", "1"],
    # a bits budget between them: a second plane where it buys the most
    "gptq-bits2.5": ["--method", "gptq", "--bits", "2.5"],
    "gptq-bits3": ["--method", "gptq", "--bits", "3.0"],
    "gptq-bits2.5-demo": ["--method", "gptq", "--bits", "2.5", "--calib", "wikitext2", "--calib-samples", "16",
                          "--passes", "1"],
    "gptq-bits3-demo": ["--method", "gptq", "--bits", "3.0", "--calib", "wikitext2", "--calib-samples", "16",
                        "--passes", "1"],
    "w4a8-g64-demo": ["--scheme", "w4a8", "--group-size", "64", "--calib", "wikitext2", "--calib-samples", "16"],
    "gptq-row-demo": ["--method", "gptq", "--group-size", "-1", "--calib", "wikitext2", "--calib-samples", "16",
                      "--passes", "1"],
}

# name: the variant whose checkpoint it scores with int8 activations per token (W1.58A8): `--activations int8`
# only records that in the config, so the weights are the base's, loaded with the override
A8 = {"gptq-a8": "gptq", "gptq-2planes-a8": "gptq-2planes", "gptq-demo-a8": "gptq-demo",
      "gptq-2planes-demo-a8": "gptq-2planes-demo", "gptq-row-a8": "gptq-row", "gptq-row-demo-a8": "gptq-row-demo"}

# checkpoints another tool makes, on the calibration windows of the trit variant named: name: (that variant, the
# command, run with the variant's windows as IDS, the float model as MODEL and the output folder as OUT)
LLMC_PYTHON = ".venv-llmcompressor/bin/python"  # llm-compressor's own environment (make .venv-llmcompressor)
EXTERNAL = {
    "llmcompressor-w4a8-g64-demo": ("w4a8-g64-demo", [LLMC_PYTHON, "benchmarks/llmcompressor_w4a8.py", "MODEL", "IDS",
                                                      "OUT", "--group-size", "64"]),
    # trit's GPTQ on int2 with zero points, the one-plane recipe's calibration (a float checkpoint, for scoring)
    "int2-g64-demo": ("gptq-demo", [sys.executable, "benchmarks/int2_gptq.py", "MODEL", "OUT", "--group-size", "64",
                                    "--calib", "wikitext2", "--calib-samples", "16"]),
    # the same two on the default recipe's calibration (128 windows sampled from the model; int2 rotated as well)
    "llmcompressor-w4a8-g64": ("w4a8-g64", [LLMC_PYTHON, "benchmarks/llmcompressor_w4a8.py", "MODEL", "IDS", "OUT",
                                            "--group-size", "64"]),
    "int2-g64": ("gptq", [sys.executable, "benchmarks/int2_gptq.py", "MODEL", "OUT", "--group-size", "64"]),
}

# name: (the one-plane variant it starts from, its trit heal flags), healed with trit heal's defaults otherwise
# (data-free: every training sequence sampled from the float model); --heal-sample-batch and
# --heal-no-grad-checkpointing add theirs; the flags go through trit heal's own parser
HEALED = {
    "healed": ("gptq", []),
    "healed-no-rotate": ("gptq-no-rotate", []),
    # heal's defaults before they were chosen on the geometric mean: 2048 sequences sampled from BOS alone (the
    # committed H200 runs' "healed" rows)
    "healed-bos-2048": ("gptq", ["--sample-first", "bos", "--train-samples", "2048"]),
    # the candidates for the defaults: sequences that start at a random token (as calibration's), then twice the
    # sequences (heal's defaults since: the same as "healed"), then twice the main phase's steps too
    "healed-random-first": ("gptq", ["--sample-first", "random", "--train-samples", "2048"]),
    "healed-random-first-4096": ("gptq", ["--sample-first", "random", "--train-samples", "4096"]),
    "healed-random-first-4096-7200": ("gptq", ["--sample-first", "random", "--train-samples", "4096",
                                               "--steps", "7200"]),
    # heal's defaults on a bits budget's mix of one and two planes
    "healed-bits2.5": ("gptq-bits2.5", []),
    "healed-bits3": ("gptq-bits3", []),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default="bf16,absmean,gptq,gptq-2planes")
    ap.add_argument("--device", default="cpu", help="where GPTQ and the evaluation run")
    ap.add_argument("--work", type=Path, default=None, help="keep (and reuse) the checkpoints here")
    ap.add_argument("--max-windows", type=int, default=16)
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows an earlier run of the same command wrote to --out and score only the rest")
    ap.add_argument("--heal-sample-batch", type=int, default=None,
                    help="healed variants: sequences the teacher samples at once (default: trit heal's)")
    ap.add_argument("--heal-no-grad-checkpointing", action="store_true",
                    help="healed variants: trit heal --no-grad-checkpointing (faster where memory allows: the "
                         "measured heal recipes ran so)")
    ap.add_argument("--gsm8k-limit", type=int, default=0, help="GSM8K problems a variant (0: none)")
    ap.add_argument("--gsm8k-variants", default="bf16,gptq", help="the variants scored on GSM8K")
    return ap.parse_args(argv)


def _size(path: Path) -> tuple[float, float | None]:
    """Size on disk (MiB, safetensors) and bits a quantized weight (codes at their stored width, scales included;
    W4A8 codes counted at 4 bits, as served), None for a float checkpoint."""
    from trit import compressed
    from trit.checkpoint import open_checkpoint

    ckpt = open_checkpoint(path)
    size = sum(s.stat().st_size for s in ckpt.shards) / 2**20
    if (path / "int2_gptq.json").is_file():  # dequantized int2 (benchmarks/int2_gptq.py): the bits it stands for
        return size, json.loads((path / "int2_gptq.json").read_text())["bits_per_weight"]
    if ckpt.quantization_config is None:
        return size, None
    if compressed.is_w4a8(ckpt.quantization_config):
        scales = [n.removesuffix("_scale") for n in ckpt.tensors if n.endswith(".weight_scale")]
        weights = sum(ckpt.tensors[n].meta().numel() for n in scales)
        scale_bits = sum(8 * ckpt.tensors[f"{n}_scale"].nbytes for n in scales)
        return size, (4 * weights + scale_bits) / weights
    from trit.eval.audit import audit

    return size, audit(path, values=False).bits_per_weight


def _calibration_ids(float_dir: Path, flags: list[str], device: str) -> torch.Tensor:
    from trit.calibrate import CalibConfig, calibration_ids
    from trit.checkpoint import open_checkpoint

    def flag(name: str, default):
        return type(default)(flags[flags.index(name) + 1]) if name in flags else default

    calib = CalibConfig(flags[flags.index("--calib") + 1] if "--calib" in flags else None,
                        flag("--calib-samples", CalibConfig.samples), flag("--calib-seq-len", CalibConfig.seq_len),
                        first=flag("--calib-first", CalibConfig.first), batch=flag("--calib-batch", CalibConfig.batch))
    return calibration_ids(open_checkpoint(float_dir), calib, device)


def main() -> int:
    args = parse_args()
    from trit import runtime, smollm2
    from trit.cli import main as trit_main
    from trit.corpora import halves, read
    from trit.eval.overlap import check_disjoint_each
    from trit.eval.perplexity import PerplexityOptions, geometric_mean, perplexity, tokenize_text

    float_dir = smollm2.float_checkpoint()
    work = args.work or Path(f"/tmp/trit-quality-{int(time.time())}")
    opts = PerplexityOptions(max_windows=args.max_windows)
    command = " ".join(["benchmarks/quality_domains.py", *(a for a in sys.argv[1:] if a != "--resume")])
    result = {"command": command, "model": smollm2.MODEL_NAME,
              "device": args.device, "host": platform.processor() or platform.machine(),
              "gpu": torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "corpora": list(CORPORA),
              "eval": f"the first {opts.max_windows} windows of {opts.seq_len} tokens of each corpus's evaluation half",
              "rows": []}
    if args.resume and args.out.is_file():
        earlier = json.loads(args.out.read_text())
        if earlier.get("command") != command:
            raise SystemExit(f"--resume: {args.out} was written by another command: {earlier.get('command')}")
        result["rows"] = [r for r in earlier["rows"] if r["variant"] in args.variants.split(",")]
    done = {r["variant"] for r in result["rows"]}
    texts = {name: halves(read(name)[1])[0] for name in CORPORA}

    def make(name: str, flags: list[str]) -> tuple[Path, float]:
        path = work / name
        if (path / "config.json").is_file():
            return path, 0.0
        t = time.perf_counter()
        code = trit_main(["quantize", str(float_dir), str(path), *flags, "--device", args.device, "--quiet"])
        if code:
            raise SystemExit(f"{name}: trit quantize exited {code}")
        return path, time.perf_counter() - t

    def make_external(name: str, flags: list[str]) -> tuple[Path, float]:
        path = work / name
        if (path / "config.json").is_file():
            return path, 0.0
        ids_file = work / f"{name}.ids.pt"
        work.mkdir(parents=True, exist_ok=True)
        torch.save(_calibration_ids(float_dir, flags, args.device), ids_file)
        t = time.perf_counter()
        fill = {"MODEL": str(float_dir), "IDS": str(ids_file), "OUT": str(path)}
        subprocess.run([fill.get(a, a) for a in EXTERNAL[name][1]], check=True)
        return path, time.perf_counter() - t

    for name in args.variants.split(","):
        if name in done:
            continue
        base, heal_flags = HEALED.get(name, (A8.get(name, name), None))
        if name in EXTERNAL:  # another tool's checkpoint, on the windows of a trit variant
            flags = VARIANTS[EXTERNAL[name][0]]
            path, seconds = make_external(name, flags)
            command = " ".join(EXTERNAL[name][1]) + f" (IDS: the calibration windows of {EXTERNAL[name][0]})"
        else:
            flags = VARIANTS[base]
            path, seconds = float_dir, 0.0
            if flags is not None:
                path, seconds = make(base, flags)
            command = None if flags is None else " ".join(["trit quantize MODEL OUT", *flags,
                                                            *(["--activations", "int8"] if name in A8 else [])])
        heal_report = None
        if heal_flags is not None:
            from trit.cli import heal_config, parser
            from trit.heal import heal

            healed = work / name
            t = time.perf_counter()
            heal_flags = [*heal_flags, *(["--sample-batch", str(args.heal_sample_batch)]
                                         if args.heal_sample_batch is not None else []),
                          *(["--no-grad-checkpointing"] if args.heal_no_grad_checkpointing else [])]
            heal_args = parser().parse_args(["heal", str(path), str(healed), "--teacher", str(float_dir),
                                              *heal_flags, "--device", args.device])
            heal_report = heal(path, float_dir, healed, heal_config(heal_args), overwrite=True,
                               progress=True,  # progress on stderr: a run cut short shows how far it got
                               log=lambda line: print(line, file=sys.stderr))  # stdout holds the JSON rows
            path, heal_seconds = healed, time.perf_counter() - t
            command = " ".join(["trit quantize MODEL BASE", *flags, "&& trit heal BASE OUT --teacher MODEL",
                                *heal_flags])
        loaded = runtime.load(path, device=args.device, dtype=torch.float32,
                              activations="int8_per_token" if name in A8 else None)
        windows = {c: tokenize_text(loaded, texts[c]) for c in CORPORA}
        calibrated = "--scheme" in flags or ("--method" in flags and flags[flags.index("--method") + 1] == "gptq") \
            if flags is not None else False
        sources = [("calibration", _calibration_ids(float_dir, flags, args.device))] if calibrated else []
        if heal_report is not None:
            sources.append(("heal training windows", heal_report.train_windows))
        spans = {c: windows[c][: opts.seq_len * opts.max_windows] for c in CORPORA}
        for what, ids in sources:  # each source's n-grams built once, for every corpus
            check_disjoint_each(ids, spans, f"{name}: {what}")
        ppl = {c: perplexity(loaded, windows[c], opts, progress=False).perplexity for c in CORPORA}
        row = {"variant": name, "command": command, "perplexity": ppl,
               "geometric_mean": geometric_mean(list(ppl.values())), "quantize_seconds": seconds}
        if heal_report is not None:
            row["heal_seconds"] = heal_seconds
            row["heal"] = heal_report.summary()
            # (step, held-out KL, seconds since the first step) at each evaluation: whether it was still improving
            row["heal_heldout"] = [(step, kl, round(sec, 1))
                                   for (step, kl), sec in zip(heal_report.heldout, heal_report.elapsed)]
        row["size_mib"], row["bits_per_weight"] = _size(path)
        del loaded
        if args.gsm8k_limit and name in args.gsm8k_variants.split(","):
            from dataclasses import asdict

            from trit.eval.gsm8k import Gsm8kError, Gsm8kOptions, run_gsm8k

            try:
                g = run_gsm8k(path, Gsm8kOptions(limit=args.gsm8k_limit))
                row["gsm8k"] = {"limit": args.gsm8k_limit, "fewshot": 5, "exact_match": g.exact_match,
                                "stderr": g.stderr, "seconds": g.seconds, "detail": asdict(g)}
            except Gsm8kError as e:
                row["gsm8k"] = {"limit": args.gsm8k_limit, "error": str(e)[-2000:]}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    bf16 = next((r for r in result["rows"] if r["variant"] == "bf16"), None)
    if bf16:
        for r in result["rows"]:
            r["ratio_to_bf16"] = {c: r["perplexity"][c] / bf16["perplexity"][c] for c in CORPORA}
            r["geometric_mean_ratio"] = r["geometric_mean"] / bf16["geometric_mean"]
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
