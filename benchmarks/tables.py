"""Markdown tables for the README, made from the committed result files (never typed by hand).

    python benchmarks/tables.py kernels   # from benchmarks/results/kernels.json
    python benchmarks/tables.py vllm      # from benchmarks/results/vllm_*.json
    python benchmarks/tables.py a8        # from benchmarks/results/a8.json
    python benchmarks/tables.py ptq       # from benchmarks/results/ptq_smollm2_h200.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def kernels() -> str:
    d = json.loads((RESULTS / "kernels.json").read_text())
    ms = sorted({r["m"] for r in d["rows"]})
    lines = [
        f"Device time per call, us (CUDA-graph replays; {d['device']}, torch {d['torch']}, triton {d['triton']}); "
        "trit / bf16 cuBLAS, and the speed-up:",
        "",
        "| layer (N x K) | " + " | ".join(f"M={m}" for m in ms) + " |",
        "|---|" + "---|" * len(ms),
    ]
    for model in dict.fromkeys(r["model"] for r in d["rows"]):
        for layer in dict.fromkeys(r["layer"] for r in d["rows"] if r["model"] == model):
            rows = {r["m"]: r for r in d["rows"] if r["model"] == model and r["layer"] == layer}
            r0 = rows[ms[0]]
            cells = [f"{rows[m]['trit_us']:.1f} / {rows[m]['bf16_us']:.1f} (x{rows[m]['speedup_vs_bf16']:.2f})"
                     for m in ms]
            lines.append(f"| {model} {layer} ({r0['n']}x{r0['k']}) | " + " | ".join(cells) + " |")
    lines += ["", "Summed over each model's four layers, speed-up over bf16:", ""]
    lines += [f"- {name}: x{v:.2f}" for name, v in d["summed_speedup_vs_bf16"].items()]
    best = max((r for r in d["rows"] if r["m"] == 1), key=lambda r: r["trit_gbps"])
    lines += ["", f"Best M=1 bandwidth: {best['trit_gbps']:.0f} GB/s ({best['model']} {best['layer']}); "
              f"bf16 cuBLAS reached {max(r['bf16_gbps'] for r in d['rows'] if r['m'] == 1):.0f} GB/s."]
    return "\n".join(lines)


def vllm() -> str:
    lines = ["| run | engine load, s | greedy tokens equal to the runtime's (of 24, per prompt) |", "|---|---|---|"]
    for name in ("graphs", "fp8", "bitnet"):
        d = json.loads((RESULTS / f"vllm_{name}.json").read_text())
        r = d[name]
        lines.append(f"| {name} ({', '.join(f'{k}={v}' for k, v in r['kwargs'].items())}) | "
                     f"{r['load_seconds']:.0f} | {r['tokens_equal_before_first_difference']} |")
    return "\n".join(lines)


def a8() -> str:
    d = json.loads((RESULTS / "a8.json").read_text())
    models = list(dict.fromkeys(r["model"] for r in d["rows"]))
    ms = sorted({r["m"] for r in d["rows"]})
    lines = [
        f"Summed over each model's four layers, bf16 cuBLAS time over trit's W1.58A8 time ({d['device']}; "
        "activation quantization included):",
        "",
        "| model | " + " | ".join(f"M={m}" for m in ms) + " |",
        "|---|" + "---|" * len(ms),
    ]
    for model in models:
        cells = [f"x{d['summed_speedup_vs_cublas_bf16'][f'{model} M={m}']:.2f}" for m in ms]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    best = max(d["rows"], key=lambda r: r["a8_tops"])
    lines += ["", f"Peak {best['a8_tops']:.0f} int8 TOPS ({best['model']} {best['layer']}, M={best['m']}); "
              f"largest error against the reference {max(r['rel_err_vs_reference'] for r in d['rows']):.1e} "
              "(relative, bf16 output)."]
    return "\n".join(lines)


def ptq() -> str:
    d = json.loads((RESULTS / "ptq_smollm2_h200.json").read_text())
    lines = [
        f"{d['model']}; {d['eval']}; calibration: {d['calibration']}. On one {d['device']} "
        f"(`{d['command']}`):",
        "",
        "| variant | WikiText-2 perplexity | x bf16 | bits per weight | time, s |",
        "|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        lines.append(f"| {r['variant']} | {r['perplexity']:.6g} | {r['ratio_to_bf16']:.3g} | "
                     f"{r['bits_per_weight']:.3f} | {r['seconds']:.0f} |")
    heal = next((r for r in d["rows"] if r["variant"] == "healed"), None)
    if heal:
        best = min(heal["heldout_kl"], key=lambda s: s[1])
        lines += ["", f"healed: gptq-g64, then {heal['heal_steps']} heal steps in {heal['heal_seconds']:.0f} s; "
                  f"held-out KL {heal['heldout_kl'][0][1]:.3f} at step 0, best {best[1]:.3f} at step {best[0]} "
                  f"(written), {heal['heldout_kl'][-1][1]:.3f} at the last step."]
    return "\n".join(lines)


if __name__ == "__main__":
    print({"kernels": kernels, "vllm": vllm, "a8": a8, "ptq": ptq}[sys.argv[1]]())
