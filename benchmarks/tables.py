"""Markdown tables for the README and docs/, made from the committed result files (never typed by hand).

    python benchmarks/tables.py kernels   # from benchmarks/results/kernels.json
    python benchmarks/tables.py vllm      # from benchmarks/results/vllm_*.json
    python benchmarks/tables.py a8        # from benchmarks/results/a8.json
    python benchmarks/tables.py ptq       # from benchmarks/results/ptq_smollm2_*.json (every run)
    python benchmarks/tables.py quality   # the headline rows of those files
    python benchmarks/tables.py kernels-h100  # from benchmarks/results/kernels_h100_m512.json
    python benchmarks/tables.py speedups  # kernels_h100_m512.json and kernels.json summed per model and M
    python benchmarks/tables.py mma       # from benchmarks/results/mma_h200.json (benchmarks/exp_mma.py)
    python benchmarks/tables.py layout-scales  # from benchmarks/results/layout_scales_cpu.json
    python benchmarks/tables.py lm-head   # from benchmarks/results/lm_head_cost_cpu.json (benchmarks/lm_head_cost.py)
    python benchmarks/tables.py repack    # from benchmarks/results/repack_h200.json (benchmarks/repack_time.py)
    python benchmarks/tables.py serving   # the headline rows of benchmarks/results/decode/vllm*.json
    python benchmarks/tables.py serve     # from benchmarks/results/serve/*.json (trit bench serve)
    python benchmarks/tables.py serve-fresh  # from benchmarks/results/serve-fresh-h100/*.json (the README's)
    python benchmarks/tables.py serve-decode  # from benchmarks/results/serve-decode-h100/*.json
    python benchmarks/tables.py serve-distinct  # from benchmarks/results/serve-distinct-h100/*.json
    python benchmarks/tables.py serve-sweep  # from benchmarks/results/serve-sweep-h100/*.json (the README's)
    python benchmarks/tables.py serve-a8  # from benchmarks/results/serve-a8-h100/*.json (W1.58A8, the README's)
    python benchmarks/tables.py cpu       # from benchmarks/results/cpu.json (trit bench cpu)
    python benchmarks/tables.py cpu-models  # its end-to-end rows alone (the README's)
    python benchmarks/tables.py domains   # from benchmarks/results/quality_domains_*.json (quality_domains.py)
    python benchmarks/tables.py decode    # from benchmarks/results/decode/*.json
    python benchmarks/tables.py decode-plots  # the PNGs beside them (needs matplotlib)
    python benchmarks/tables.py serve-budget  # from benchmarks/results/serve-budget/*.json (a small card's budget)
    python benchmarks/tables.py serve-h100  # from benchmarks/results/serve-h100/*.json (the same runs on an H100)
    python benchmarks/tables.py plan-vllm  # trit plan against the peaks of those runs' trit servers
    python benchmarks/tables.py serve-plot  # serve.png beside the runs of each serve table's folder
    python benchmarks/tables.py --write   # every marked block of README.md and docs/*.md, in place

A marked block is ``<!-- table:NAME -->`` ... ``<!-- /table:NAME -->``; ``--write`` replaces what lies between
with the output of ``NAME``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
SRC = Path(__file__).resolve().parents[1] / "src"  # the decode tables use trit's own plan and plot
# the serve runs with prompts of a seed of their own at every level and CUDA graphs up to 512 tokens, each model's two
# weight kinds in one invocation on one H100 (the README's serve table)
FRESH = "serve-fresh-h100"
# Llama-3-8B served again after the shorter decode, on the table tuned in the same session (one H100)
DECODE_SERVE = "serve-decode-h100"
# Llama-3-8B with the word tokenizer: prompts no server had been sent (one H100; bf16 in a second invocation)
DISTINCT_SERVE = "serve-distinct-h100"
# every level of Llama-3-8B and Qwen2-1.5B on distinct prompts, each model's two kinds in one invocation (H100s)
SWEEP_SERVE = "serve-sweep-h100"
# W1.58A8 served (`--activations int8`): Llama-3-8B's trit weights as a BitNet import holds them, and BitNet 2B4T's
# shape through the plugin's BitNet model, each against its bf16 twin in one invocation (one H100)
A8_SERVE = "serve-a8-h100"


def kernels(name: str = "kernels.json") -> str:
    """``trit bench kernels`` (``benchmarks/results/<name>``): every layer shape's time per M, and the sums."""
    d = json.loads((RESULTS / name).read_text())
    ms = sorted({r["m"] for r in d["rows"]})
    v1 = any(r.get("v1_us") for r in d["rows"])
    lines = [
        f"Device time per call, us (CUDA-graph replays; {d['device']}, torch {d['torch']}, triton {d['triton']}); "
        + ("trit (the mma layout's kernel, as a loaded layer runs) / format v1's Triton kernels / bf16 cuBLAS, and "
           "trit's speed-up:" if v1 else "trit / bf16 cuBLAS, and the speed-up:"),
        "",
        "| layer (N x K) | " + " | ".join(f"M={m}" for m in ms) + " |",
        "|---|" + "---|" * len(ms),
    ]
    for model in dict.fromkeys(r["model"] for r in d["rows"]):
        for layer in dict.fromkeys(r["layer"] for r in d["rows"] if r["model"] == model):
            rows = {r["m"]: r for r in d["rows"] if r["model"] == model and r["layer"] == layer}
            r0 = rows[ms[0]]
            cells = [f"{rows[m]['trit_us']:.1f} / "
                     + (f"{rows[m]['v1_us']:.1f} / " if rows[m].get("v1_us") else "")
                     + f"{rows[m]['bf16_us']:.1f} (x{rows[m]['speedup_vs_bf16']:.2f})" for m in ms]
            lines.append(f"| {model} {layer} ({r0['n']}x{r0['k']}) | " + " | ".join(cells) + " |")
    lines += ["", "Summed over each model's four layers, speed-up over bf16:", ""]
    lines += [f"- {name}: x{v:.2f}" for name, v in d["summed_speedup_vs_bf16"].items()]
    best = max((r for r in d["rows"] if r["m"] == 1), key=lambda r: r["trit_gbps"])
    copy = d["copy_bandwidth_bytes_per_s"] / 1e9
    bf16 = max(r["bf16_gbps"] for r in d["rows"] if r["m"] == 1)
    lines += ["", f"Best M=1 bandwidth: {best['trit_gbps']:.0f} GB/s ({best['model']} {best['layer']}), "
              f"{best['trit_gbps'] / copy:.0%} of the {copy:.0f} GB/s device-to-device copy measured in the run; "
              f"bf16 cuBLAS reached {bf16:.0f} GB/s ({bf16 / copy:.0%})."]
    return "\n".join(lines)


def mma() -> str:
    """``benchmarks/exp_mma.py``: the CUDA C++ kernels on the load-time layout against format v1's dispatch."""
    d = json.loads((RESULTS / "mma_h200.json").read_text())
    ms = sorted({r["m"] for r in d["rows"]})
    layout = any("layout_us" in r for r in d["rows"])  # a run of the GEMV and the dequantizer too
    what = ("mma layout (its fastest kernel: GEMV for M <= 4, mma up to 64, dequantize + cuBLAS from 16)" if layout
            else "the mma kernel")
    lines = [f"Device time per call, us (CUDA-graph replays, {d['device']}; copy {d['copy_gbs']:.0f} GB/s in the run): "
             f"{what} / format v1's Triton dispatch / bf16 cuBLAS:", "",
             "| layer (N x K) | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
    for model in dict.fromkeys(r["model"] for r in d["rows"]):
        for layer in dict.fromkeys(r["layer"] for r in d["rows"] if r["model"] == model):
            rows = {r["m"]: r for r in d["rows"] if r["model"] == model and r["layer"] == layer}
            r0 = rows[ms[0]]
            cells = [f"{rows[m].get('layout_us', rows[m].get('mma_us')):.1f} / {rows[m]['shipped_us']:.1f} / "
                     f"{rows[m]['bf16_us']:.1f}" for m in ms]
            lines.append(f"| {model} {layer} ({r0['n']}x{r0['k']}) | " + " | ".join(cells) + " |")
    lines += ["", f"Summed over each model's layers, speed-up over bf16 ({what}, format v1):", ""]
    lines += [f"- {line}" for line in d["summary"]]
    checks = [c for c in d["checks"] if "rel_err" in c]
    worst = max(c["rel_err"] / c["bf16_dense_rel_err"] for c in checks)
    lines += ["", f"Correctness in the same run: {len(checks)} kernel checks on odd shapes (every group size, "
              f"split-K on and off), error against the float32 reference at most x{worst:.2f} that of bf16 `F.linear` "
              "on the same weights."]
    deq = [c for c in d["checks"] if c.get("kernel") == "dequantize"]
    if deq:
        lines[-1] += (" The dequantizer equal to the layout's weight bit for bit." if all(c["exact"] for c in deq)
                      else " The dequantizer NOT equal to the layout's weight.")
    return "\n".join(lines)


# the full kernel runs the README sums, newest first: (file, its row label, what tree and table it measured)
KERNEL_RUNS = (("kernels_h100_m512.json", "12-06", "2026-12-06, with the warp-specialized wgmma kernel and the "
                "shorter decode, on the H100 table tuned on them, and at 512 rows in a later session"),
               ("kernels.json", "12-04", "2026-12-04, before both, on the H200 table of then"))


def speedups() -> str:
    """bf16 time over trit time, summed over each model's four layer shapes, per M, for each full kernel run."""
    runs = [(name, label, when, json.loads((RESULTS / name).read_text())) for name, label, when in KERNEL_RUNS]
    ms = sorted({r["m"] for *_, d in runs for r in d["rows"]})
    lines = ["| model (summed over its layers) | run | " + " | ".join(f"M={m}" for m in ms) + " |",
             "|---|---|" + "---|" * len(ms)]
    models = list(dict.fromkeys(r["model"] for *_, d in runs for r in d["rows"]))
    for model in models:
        for _, label, _, d in runs:
            gpu = d["device"].removeprefix("NVIDIA ").split()[0] + ", " + label
            sums = d["summed_speedup_vs_bf16"]
            lines.append(f"| {model} | {gpu} | " + " | ".join(
                f"x{sums[f'{model} M={m}']:.2f}" if f"{model} M={m}" in sums else "-" for m in ms) + " |")
            # format v1's row where every layer of every M this run measured has its time ("-" at an M it did not)
            sel = {m: [r for r in d["rows"] if r["model"] == model and r["m"] == m] for m in ms}
            if all(all(r.get("v1_us") for r in rows) for rows in sel.values()) and any(sel.values()):
                lines.append(f"| {model}, format v1 (`TRIT_LAYOUT=v1`) | {gpu} | " + " | ".join(
                    f"x{sum(r['bf16_us'] for r in sel[m]) / sum(r['v1_us'] for r in sel[m]):.2f}" if sel[m] else "-"
                    for m in ms) + " |")
    lines += ["", "bf16 cuBLAS time / trit time, each run against bf16 on its own card, CUDA graphs, weights rotated "
              "past the L2: " + "; ".join(f"{d['device']}, `benchmarks/results/{name}` ({when})" for name, _, when, d in runs)
              + ". The runs differ in card, tree and tuning at once, so their rows do not compare the cards."]
    return "\n".join(lines)


# the headline quality rows: (label, file, variant or None for the file's healed row)
QUALITY = (
    ("bf16", "ptq_smollm2_h200.json", "bf16"),
    ("naive rounding (absmean, BitNet's rule)", "ptq_smollm2_h200.json", "absmean-g64"),
    ("GPTQ, one plane, 128 WikiText windows (`--calib wikitext2 --calib-samples 128`)",
     "ptq_smollm2_calib128_3passes_h200.json",
     "gptq-g64-float-target-3passes"),
    ("GPTQ, two planes, WikiText windows (`--planes 2 --calib wikitext2`)", "ptq_smollm2_h200.json",
     "gptq-2planes-g64"),
    ("healed, data-free (`trit heal` with its defaults then: 2048 sequences sampled from BOS)",
     "ptq_smollm2_heal_datafree_h200.json", None),
    ("healed on text + sampled (`--data --mix-sampled`)", "ptq_smollm2_heal_mix_h200.json", None),
)


def quality() -> str:
    bf16 = next(r for r in json.loads((RESULTS / "ptq_smollm2_h200.json").read_text())["rows"] if r["variant"] == "bf16")
    lines = ["| SmolLM2-135M-Instruct | WikiText-2 perplexity | x bf16 | bits a weight | file |", "|---|---|---|---|---|"]
    for label, name, variant in QUALITY:
        rows = json.loads((RESULTS / name).read_text())["rows"]
        r = next(r for r in rows if r["variant"] == (variant or "healed"))
        lines.append(f"| {label} | {r['perplexity']:.4g} | {r['perplexity'] / bf16['perplexity']:.3g} | "
                     f"{r['bits_per_weight']:.2f} | `{name}` |")
    lines += ["", "First 16 windows of 512 tokens of the WikiText-2 test set; the GPTQ rows are calibrated on the other "
              "half of the same file (never overlapping the windows), so they flatter WikiText: the table below "
              "holds the defaults on three domains; one H200 (each file holds its command)."]
    return "\n".join(lines)


def vllm() -> str:
    lines = ["| run | engine load, s | greedy tokens equal to the runtime's (of 24, per prompt) |", "|---|---|---|"]
    for name in ("graphs", "fp8", "bitnet"):
        d = json.loads((RESULTS / f"vllm_{name}.json").read_text())
        r = d[name]
        lines.append(f"| {name} ({', '.join(f'{k}={v}' for k, v in r['kwargs'].items())}) | "
                     f"{r['load_seconds']:.0f} | {r['tokens_equal_before_first_difference']} |")
    layout = RESULTS / "vllm_graphs_layout.json"
    if layout.is_file():  # the same check under each TRIT_LAYOUT, in one session
        d = json.loads(layout.read_text())
        for name in ("v1", "mma"):
            r = d[name]["graphs"]
            lines.append(f"| graphs, TRIT_LAYOUT={name} (a later session) | {r['load_seconds']:.0f} | "
                         f"{r['tokens_equal_before_first_difference']} |")
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
        f"(`{d['command']}`), then later runs on the same GPU (each row's file and command below):",
        "",
        "| variant | calibration windows | WikiText-2 perplexity | x bf16 | bits per weight | time, s |",
        "|---|---|---|---|---|---|",
    ]
    # the main run, then each later run (other calibration sizes, heal settings) without its bf16 row
    later = [(path, json.loads(path.read_text())) for path in sorted(RESULTS.glob("ptq_smollm2_*_h200.json"))]
    rows = d["rows"] + [r for _, run in later for r in run["rows"] if r["variant"] != "bf16"]
    bf16 = next(r["perplexity"] for r in d["rows"] if r["variant"] == "bf16")  # same model and windows in every run
    for r in rows:
        lines.append(f"| {_ptq_name(r)} | {_flag(r, '--calib-samples') or '-'} | {r['perplexity']:.6g} | "
                     f"{r['perplexity'] / bf16:.3g} | {r['bits_per_weight']:.3f} | {r['seconds']:.0f} |")
    lines.append("")
    for heal in (r for r in rows if r["variant"] == "healed"):
        best = min(heal["heldout_kl"], key=lambda s: s[1])
        phase = "its last phase: " if heal["command"].count(";") > 1 else ""
        lines.append(f"- {_ptq_name(heal)}: {phase}{heal['heal_steps']} heal steps in {heal['heal_seconds']:.0f} s"
                     + (f" ({heal['heal_tokens'] / 1e6:.1f}M tokens)" if "heal_tokens" in heal else "")
                     + f"; held-out KL {heal['heldout_kl'][0][1]:.3f} at step 0, best {best[1]:.3f} at step "
                     f"{best[0]} (written), {heal['heldout_kl'][-1][1]:.3f} at the last step.")
    lines += ["", "Later runs: " + "; ".join(f"{path.name}: `{run['command']}`" for path, run in later)]
    return "\n".join(lines)


def _flag(row: dict, flag: str, part: int = 0) -> str | None:
    """A flag's value in part ``part`` (0: quantize, 1: heal) of a row's equivalent trit command."""
    parts = row["command"].split(";")
    return _last_flag(parts[part].split() if part < len(parts) else [], flag, None)


def _ptq_name(row: dict) -> str:
    """``healed (BASE; PHASE -> PHASE)``, each heal phase read back from the row's equivalent commands."""
    if row["variant"] != "healed":
        return row["variant"]
    quantize, *heals = row["command"].split(";")
    base = "gptq-g64" + ("-float-target" if "--float-target" in quantize.split() else "") + (
        f"-{_flag(row, '--passes')}passes" if _flag(row, "--passes") not in (None, "1") else "")
    phases = []
    for i, heal in enumerate(heals, 1):
        words = heal.split()
        what = "scales+norms" if "--freeze-codes" in words else "all"
        what += "+embeddings" if "--train-embeddings" in words else ""
        # compiled: the flag, or a run made after heal learned to compile (it records the seconds at each
        # evaluation) without --no-compile; every run before that was eager and names neither flag
        compiled = "--compile" in words or ("heldout_elapsed" in row and "--no-compile" not in words)
        seq = _flag(row, "--seq-len", i)
        weight_lr = _flag(row, "--weight-lr", i)
        mix = _flag(row, "--mix-sampled", i)
        data = (f"{'text' if '--data' in words else 'teacher-sampled'} data" + (f" + {mix} sampled" if mix else "")
                + f", batch {_flag(row, '--batch', i) or 8}" + (f"x{seq}" if seq else "")
                + (", compiled" if compiled else ""))
        first = _flag(row, "--scales-first", i)
        if first:  # two phases in one run
            phases.append(f"{data}, scales+norms{what.removeprefix('all')}, lr {_flag(row, '--scales-first-lr', i)}, "
                          f"{first} steps")
        phases.append(f"{data}, {what}, lr {_flag(row, '--lr', i)}"
                      + (f", weight lr {weight_lr}" if weight_lr else "") + f", {_flag(row, '--steps', i)} steps")
    return f"healed ({base}; {' -> '.join(phases)})"


DECODE = RESULTS / "decode"
# which file holds which engine's figures (the warm-start file and the killed first Qwen2 run are not here)
DECODE_FILES = {"vllm": ("vllm.json", "vllm_qwen2_bf16.json", "vllm_qwen2_trit.json", "vllm_27b.json"),
                "runtime": ("runtime.json",), "compiled": ("runtime_compiled.json",)}
GiB = 2**30


def _decode_workers(kind: str) -> list[dict]:
    return [w for f in DECODE_FILES[kind] for w in json.loads((DECODE / f).read_text())["workers"]
            if not w["error"] and w["runs"]]


def _decode_runs(kind: str) -> dict[tuple, dict]:
    """(model, weights, batch, max_len) -> run."""
    return {(r["model"], r["weights"], r["batch"], r["max_len"]): r for w in _decode_workers(kind) for r in w["runs"]}


def _speed_table(runs: dict[tuple, dict], with_ttft: bool) -> list[str]:
    head = "| model | batch | bf16 tok/s | trit tok/s | trit / bf16 | trit p50 / p99 ms a token | peak GiB bf16 / trit |"
    if with_ttft:
        head += " TTFT ms bf16 / trit | whole-run tok/s bf16 / trit |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (model, weights, batch, max_len), t in runs.items():
        b = runs.get((model, "bf16", batch, max_len))
        if weights != "trit" or max_len != t["prompt"] + t["new_tokens"] or t["prompt"] != 512:
            continue
        if b is None:  # no bf16 run to compare with (it did not finish): the trit figures alone
            lines.append(f"| {model} | {batch} | - | {t['decode_tokens_per_s']:.0f} | - | {t['tpot_p50_ms']:.2f} / "
                         f"{t['tpot_p99_ms']:.2f} | - / {t['peak_bytes'] / GiB:.1f} |" + " - | - |" * with_ttft)
            continue
        row = (f"| {model} | {batch} | {b['decode_tokens_per_s']:.0f} | {t['decode_tokens_per_s']:.0f} | "
               f"x{t['decode_tokens_per_s'] / b['decode_tokens_per_s']:.2f} | {t['tpot_p50_ms']:.2f} / "
               f"{t['tpot_p99_ms']:.2f} | {b['peak_bytes'] / GiB:.1f} / {t['peak_bytes'] / GiB:.1f} |")
        if with_ttft:
            row += (f" {b['ttft_ms']:.0f} / {t['ttft_ms']:.0f} | {b['tokens_per_s']:.0f} / {t['tokens_per_s']:.0f} |")
        lines.append(row)
    return lines


def _serve_runs(folder: str = "serve") -> tuple[list[tuple[dict, str]], dict, dict]:
    """The serve runs under ``benchmarks/results/<folder>`` (oldest first), each (model, weights)'s server of most levels with its run, and the level
    the table shows at each (model, concurrency, weights), as the table and the plot both take them."""
    # oldest first: by the time a run records (``started``; files from before it have none and come first), then
    # by name
    runs = sorted(((json.loads(f.read_text()), f.name) for f in (RESULTS / folder).glob("*.json")),
                  key=lambda rf: (rf[0].get("started", ""), rf[1]))
    servers: dict[tuple[str, str], tuple[dict, dict]] = {}  # (model, weights): the server of most levels, its run
    # model: concurrency: weights: (measured beside the other weight kind in the same run, level). A level both
    # kinds ran in one invocation (same machine state, same client) wins over one measured alone; else the later run
    by_level: dict[str, dict[int, dict[str, tuple[bool, dict]]]] = {}
    sys.path.insert(0, str(SRC))
    from trit.bench.serve import median_levels

    for run, _ in runs:
        for sv in run["servers"]:
            key = (sv["model"], sv["weights"])
            if sv["levels"] and (key not in servers or len(sv["levels"]) > len(servers[key][0]["levels"])):
                servers[key] = (sv, run)
        # a run's levels, failed ones included (they count in "failed"); with --starts, the start of median
        # throughput, its starts' throughputs beside it
        med = median_levels(run["servers"])
        levels = {(sv["model"], sv["weights"], lv["concurrency"]): (lv, [])
                  for sv in run["servers"] for lv in sv["levels"]}
        levels.update(med)
        kinds = {(m, c, w) for m, w, c in levels}
        for (model, weights, c), (lv, tps) in levels.items():
            paired = all((model, c, w) in kinds for w in ("bf16", "trit"))
            slot = by_level.setdefault(model, {}).setdefault(c, {})
            if paired or not slot.get(weights, (False,))[0]:
                slot[weights] = (paired, {**lv, "starts": tps})
    return runs, servers, by_level


def _prompt_note(files: list[str]) -> str:
    """A caption's note where serve runs (``files``, relative to ``benchmarks/results``) predate the word tokenizer:
    their prompts repeated ones their server had been sent (``benchmarks/prompt_repeats.py``: the most repeated share
    of a level's prompts, at each concurrency, over these runs)."""
    d = json.loads((RESULTS / "serve_prompt_repeats_cpu.json").read_text())
    old = [r for r in d["runs"] if r["file"] in files]
    if not old:
        return ""
    worst: dict[int, float] = {}
    for r in old:
        for sv in r["servers"]:
            for lv in sv["levels"]:
                c = lv["concurrency"]
                worst[c] = max(worst.get(c, 0.0), lv["repeats"] / lv["prompts"])
    shares = ", ".join(f"{worst[c]:.0%} at {c}" for c in sorted(worst))
    return ("; prompts from the 101-id character tokenizer, which repeat ones their server was already sent (up to "
            f"{shares}; `serve_prompt_repeats_cpu.json`), so vLLM's prefix cache served part of their prefill: see "
            "docs/serving.md")


def serve(folder: str = "serve") -> str:
    """``trit bench serve`` runs under ``benchmarks/results/<folder>``: vLLM's OpenAI server under load, vLLM's own
    client, bf16 against trit."""
    runs, servers, by_level = _serve_runs(folder)
    from trit.bench.serve import spread

    repeated = any(len(lv.get("starts") or []) > 1 for kinds in by_level.values() for slots in kinds.values()
                   for _, lv in slots.values())  # the starts column only where a run started a server twice
    # the prefix cache's share of the prompt tokens, where the runs recorded it
    hits = any(lv.get("prefix_cache_hit_rate") is not None for kinds in by_level.values()
               for slots in kinds.values() for _, lv in slots.values())
    lines = ["| model | concurrency | output tok/s bf16 | trit | trit / bf16 | TPOT p50 ms bf16 / trit | "
             "TPOT p99 ms bf16 / trit | TTFT p50 ms bf16 / trit | failed |"
             + (" prefix-cache hits bf16 / trit |" if hits else "")
             + (" server starts bf16 / trit |" if repeated else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if hits else "") + ("---|" if repeated else "")]
    any_apart = False  # the footnote explains only the marks the table holds
    for model in dict.fromkeys(m for m, _ in servers):
        levels = by_level[model]
        for c in sorted(levels):
            lb, lt = (levels[c].get(w, (False, None))[1] for w in ("bf16", "trit"))

            def num(lv, fmt_: str, *path) -> str:
                if lv is None:
                    return "-"
                v = lv
                for p_ in path:
                    v = v[p_]
                return format(v, fmt_)

            apart = not all(levels[c].get(w, (False,))[0] for w in ("bf16", "trit"))
            any_apart = any_apart or (apart and bool(lb and lt))
            ratio = (f"x{lt['output_tokens_per_s'] / lb['output_tokens_per_s']:.2f}{' *' if apart else ''}"
                     if lb and lt else "-")
            failed = sum(lv["failed"] for lv in (lb, lt) if lv)

            def share(lv) -> str:
                v = (lv or {}).get("prefix_cache_hit_rate")
                return "-" if v is None else f"{v:.0%}"

            def starts(lv) -> str:
                tps = (lv or {}).get("starts") or []
                if len(tps) < 2:
                    return "1" if lv else "-"
                return f"{len(tps)}, {spread(tps):.0%} apart"

            lines.append(f"| {model} | {c} | {num(lb, '.0f', 'output_tokens_per_s')} | "
                         f"{num(lt, '.0f', 'output_tokens_per_s')} | {ratio} | {num(lb, '.2f', 'tpot_ms', 'median')} / "
                         f"{num(lt, '.2f', 'tpot_ms', 'median')} | {num(lb, '.2f', 'tpot_ms', 'p99')} / "
                         f"{num(lt, '.2f', 'tpot_ms', 'p99')} | {num(lb, '.0f', 'ttft_ms', 'median')} / "
                         f"{num(lt, '.0f', 'ttft_ms', 'median')} | {failed} |"
                         + (f" {share(lb)} / {share(lt)} |" if hits else "")
                         + (f" {starts(lb)} / {starts(lt)} |" if repeated else ""))
    lines += ["", "| model | weights GiB bf16 / trit | KV-cache tokens bf16 / trit | trit / bf16 |", "|---|---|---|---|"]
    for model in dict.fromkeys(m for m, _ in servers):
        b, t = (servers.get((model, w), (None, None))[0] or {} for w in ("bf16", "trit"))
        kv_b, kv_t = b.get("kv_cache_tokens"), t.get("kv_cache_tokens")
        lines.append(f"| {model} | {b.get('weights_gib') or '-'} / {t.get('weights_gib') or '-'} | {kv_b or '-'} / "
                     f"{kv_t or '-'} | {f'x{kv_t / kv_b:.2f}' if kv_b and kv_t else '-'} |")
    any_run = next(iter(servers.values()))[1]
    lines += ["", f"vLLM {any_run['versions'].get('vllm', '?')} OpenAI server (multiprocess engine, CUDA graphs, "
              f"dummy weights), driven by vLLM's serving benchmark client: random prompts of {any_run['input_len']} "
              f"tokens, {any_run['output_len']} output tokens each (`--ignore-eos`), {any_run['device']}; "
              f"`benchmarks/results/{folder}/*.json` hold the commands. `-`: not measured"
              + ("; `*`: the two weight kinds were served in separate invocations" if any_apart else "")
              + _prompt_note([f"{folder}/{name}" for _, name in runs])
              + ("; with several server starts (`--starts`), the start of median throughput, and how far the starts' "
                 "throughputs lay apart" if repeated else "") + "."]
    return "\n".join(lines)


def serve_profile() -> str:
    """``trit bench serve --profile`` runs: where a step's device time goes, against the step's wall time."""
    lines = ["| run | model | weights | concurrency | TPOT p50 ms, measured level / under the profiler | "
             "kernel time a step, us | trit / attention / GEMM / other, us | a decode step's GPU span, us | "
             "span / kernel time |", "|---|---|---|---|---|---|---|---|---|"]
    # the profile runs, then the sweep's runs that profiled a level (named with their folder)
    files = sorted((RESULTS / "serve-profile").glob("*.json")) + sorted((RESULTS / SWEEP_SERVE).glob("*.json"))
    for f in files:
        run = json.loads(f.read_text())
        name = f.name if f.parent.name == "serve-profile" else f"{f.parent.name}/{f.name}"
        layout = run.get("env", {}).get("TRIT_LAYOUT") or "auto"
        for sv in run["servers"]:
            p = sv.get("profile")
            if not p or p.get("error"):
                continue
            c = p["concurrency"]
            measured = next((lv["tpot_ms"]["median"] for lv in sv["levels"] if lv["concurrency"] == c), None)
            by = p["us_per_step_by_group"]
            split = " / ".join(f"{by.get(g, 0):.0f}" for g in ("trit", "attention", "gemm", "other"))
            weights = sv["weights"] + (f" ({layout} layout)" if sv["weights"] == "trit" else "")
            span, step = p.get("decode_step_span_us"), p["us_per_step"]  # no span on a CPU clock, or no decode step
            lines.append(f"| `{name}` | {sv['model']} | {weights} | {c} | "
                         f"{'-' if measured is None else f'{measured:.2f}'} / {p['level']['tpot_ms']['median']:.2f} | "
                         f"{step:.0f} | {split} | {'-' if span is None else f'{span:.0f}'} | "
                         f"{'-' if span is None else f'x{span / step:.2f}'} |")
    lines += ["", "Kernel time a step: the worker's profiler table, kernels only, over the profiled level's steps "
              "(prefill's share included); GEMM: cuBLAS and CUTLASS outside attention (the lm_head, and bf16's "
              "linears); a decode step's span: vLLM's annotation of decode-only steps, first kernel to last on the "
              "GPU, under the profiler. The measured level ran on the same server before the profiler started."]
    return "\n".join(lines)


def _or_dash(value: float | None, spec: str) -> str:
    """``value`` formatted, or "-" where a run has none (a failed level's latencies)."""
    return "-" if value is None else format(value, spec)


def _serve_levels(folder: str):
    """(file, run, server, level) of every ``trit bench serve`` JSON in ``benchmarks/results/<folder>``, by name."""
    for f in sorted((RESULTS / folder).glob("*.json")):
        run = json.loads(f.read_text())
        for sv in run["servers"]:
            for lv in sv["levels"]:
                yield f, run, sv, lv


def serve_head() -> str:
    """``trit bench serve`` runs of one session with and without ``TRIT_LM_HEAD=int8``: each server's levels."""
    lines = ["| run | model | weights | lm_head | weights GiB | KV-cache tokens | concurrency | output tok/s | "
             "TPOT p50 / p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for f, run, sv, lv in _serve_levels("serve-int8-head"):
        head = _lm_head(run) if sv["weights"] == "trit" else "bf16"
        lines.append(f"| `{f.name}` | {sv['model']} | {sv['weights']} | {head} | {sv['weights_gib']:.2f} | "
                     f"{sv['kv_cache_tokens']} | {lv['concurrency']} | {lv['output_tokens_per_s']:.0f} | "
                     f"{lv['tpot_ms']['median']:.2f} / {lv['tpot_ms']['p99']:.2f} |")
    lines += ["", "vLLM 0.25.1's OpenAI server on one H200, random prompts of 512 tokens, 256 output tokens; the two "
              "runs one after the other on one machine; each JSON holds its command and the `TRIT_*` variables it ran "
              "with."]
    return "\n".join(lines)


def _last_flag(args: list[str], flag: str, default: str | None = "-") -> str | None:
    """The value a command line gives ``flag`` (``--flag V``, ``--flag=V``, or with underscores, as vLLM's parser
    also takes): its last, as argparse takes it."""
    names = {flag, "--" + flag[2:].replace("-", "_")}
    at = [i for i, a in enumerate(args) if a in names or a.split("=", 1)[0] in names]
    if not at:
        return default
    a = args[at[-1]]
    if "=" in a:
        return a.split("=", 1)[1]
    return args[at[-1] + 1] if at[-1] + 1 < len(args) else default


def layout_scales() -> str:
    """Perplexity in format v1 and in the mma layout (bf16 scales), the same checkpoint."""
    d = json.loads((RESULTS / "layout_scales_cpu.json").read_text())
    corpora = list(d["v1"]["corpora"])
    lines = ["| layout | " + " | ".join(corpora) + " | geo. mean |", "|---" * (len(corpora) + 2) + "|"]
    for name in ("v1", "mma"):
        r = d[name]
        lines.append(f"| {name} | " + " | ".join(f"{r['corpora'][c]['perplexity']:.3f}" for c in corpora)
                     + f" | {r['geometric_mean']:.3f} |")
    ratio = d["ratio_mma_to_v1"]
    lines.append("| mma / v1 | " + " | ".join(f"x{ratio[c]:.4f}" for c in corpora)
                 + f" | x{ratio['geometric_mean']:.4f} |")
    lines += ["", d["what"] + "; `benchmarks/results/layout_scales_cpu.json` holds the commands."]
    return "\n".join(lines)


def lm_head() -> str:
    """Perplexity with the lm_head rounded to 8 bits (``benchmarks/lm_head_cost.py``), against the stored head."""
    d = json.loads((RESULTS / "lm_head_cost_cpu.json").read_text())
    corpora = list(d["rows"][0]["perplexity"])
    lines = ["| checkpoint | lm_head | " + " | ".join(f"{c} ppl" for c in corpora) + " | geo. mean | x stored |",
             "|---" * (len(corpora) + 4) + "|"]
    stored = {r["checkpoint"]: r["geometric_mean"] for r in d["rows"] if r["lm_head"] == "as stored"}
    for r in d["rows"]:
        lines.append(f"| {r['checkpoint']} | {r['lm_head']} | "
                     + " | ".join(f"{r['perplexity'][c]:.3f}" for c in corpora)
                     + f" | {r['geometric_mean']:.3f} | x{r['geometric_mean'] / stored[r['checkpoint']]:.4f} |")
    lines += ["", f"First 16 windows of 512 tokens of each corpus, float32 on the CPU ({d['host']}, torch {d['torch']}); "
              "`benchmarks/results/lm_head_cost_cpu.json` holds the command."]
    return "\n".join(lines)


def lm_head_speed() -> str:
    """``benchmarks/lm_head_speed.py``: the int8 output layer against the bf16 one, a call's time by M."""
    d = json.loads((RESULTS / "lm_head_speed_h200.json").read_text())
    ms = sorted({r["m"] for r in d["rows"]})
    lines = ["| head (vocab x hidden) | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
    for model in dict.fromkeys(r["model"] for r in d["rows"]):
        rows = {r["m"]: r for r in d["rows"] if r["model"] == model}
        first = next(iter(rows.values()))
        cells = [f"{rows[m]['int8_us']:.0f} / {rows[m]['bf16_us']:.0f} (x{rows[m]['speedup_vs_bf16']:.2f})" for m in ms]
        lines.append(f"| {model} ({first['n']} x {first['k']}) | " + " | ".join(cells) + " |")
    best = max(d["rows"], key=lambda r: r["int8_frac_copy_bw"])
    lines += ["", f"Device time a call, us, int8 rows / bf16 cuBLAS (x: bf16 / int8), CUDA-graph replays, {d['device']}, "
              f"torch {d['torch']}, triton {d['triton']}; at best {best['int8_frac_copy_bw']:.0%} of the "
              f"{d['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s copy bandwidth of the same run ({best['model']}, "
              f"M={best['m']}); `benchmarks/results/lm_head_speed_h200.json` holds the command."]
    return "\n".join(lines)


def repack() -> str:
    """Seconds to repack whole models to the mma layout at load (``benchmarks/repack_time.py``)."""
    d = json.loads((RESULTS / "repack_h200.json").read_text())
    lines = ["| model | layers repacked | weights repacked | first call, s | second call, s | "
             "allocated GiB | peak GiB during |", "|---|---|---|---|---|---|---|"]
    for model, (a, b) in d["runs"].items():
        lines.append(f"| {model} | {a['layers_repacked']} of {a['layers']} | {a['weights_repacked'] / 1e9:.2f} of "
                     f"{a['weights_ternary'] / 1e9:.2f} G | {a['seconds']:.2f} | {b['seconds']:.2f} | "
                     f"{a['allocated_gib_before']:.2f} -> {a['allocated_gib_after']:.2f} | {a['peak_gib_during']:.2f} |")
    lines += ["", f"{d['device']}, torch {d['torch']}, `TRIT_LAYOUT={d['layout_rule']}`; each call on a fresh "
              "random model; `benchmarks/results/repack_h200.json` holds the command."]
    return "\n".join(lines)


# host-path files' trees, oldest first: before the launch change, the launch change alone (a working tree), with its
# plans, and the tree of per-thread buffers, the Library ops and the shared x check
HOST_TREES = ["75ff107", "launch_struct", "064bdde", "6361492"]


def _machines(trees: list[tuple[str, dict]]) -> str:
    """Which machine ran each tree, from the GPU UUID and host CPU ``host_path.py`` records (files written before
    it did say nothing here; ``host_path`` then names the machines in a sentence of its own)."""
    if not all("gpu_uuid" in d for _, d in trees):
        return ""
    machines = list(dict.fromkeys((d["gpu_uuid"], d.get("cpu", "?")) for _, d in trees))
    if len(machines) == 1:
        return f", one machine ({machines[0][1]})"
    return ", " + ", ".join(f"{t} on machine {machines.index((d['gpu_uuid'], d.get('cpu', '?'))) + 1} "
                            f"({d.get('cpu', '?')})" for t, d in trees)


def host_path() -> str:
    """Host time a call of the ternary ops against bf16 F.linear, the trees of a change on one kind of GPU
    (``benchmarks/host_path.py``): the files under ``host-path/`` named ``<model>_<tree>_<gpu>.json``, oldest tree
    first (:data:`HOST_TREES`)."""
    runs: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for f in sorted((RESULTS / "host-path").glob("*.json")):
        model, rest = f.stem.split("_", 1)
        tree, gpu = rest.rsplit("_", 1)
        if tree not in HOST_TREES:
            raise ValueError(f"host-path: {f.name} names tree {tree!r}, not one of {HOST_TREES}")
        runs.setdefault((model, gpu), []).append((tree, json.loads(f.read_text())))
    lines = ["| GPU | layer | M | kernel | trit host us a call, oldest tree first | bf16 host us, the same runs | "
             "trit device us | bf16 device us |", "|---|---|---|---|---|---|---|---|"]
    notes, idle = [], False
    for (model, _), trees in sorted(runs.items()):
        if len(trees) < 2:
            raise ValueError(f"host-path: {model} on one GPU needs a before and an after file, found {len(trees)}")
        trees.sort(key=lambda t: HOST_TREES.index(t[0]))
        by_row = [{(r["layer"], r["m"]): r for r in d["rows"]} for _, d in trees]
        for key, row in by_row[-1].items():
            marks = ["" if b[key]["trit_gpu_busy"] else "!" for b in by_row]
            idle = idle or any(marks)
            trit = " / ".join(f"{b[key]['trit_host_us']:.0f}{m}" for b, m in zip(by_row, marks, strict=True))
            bf16 = " / ".join(f"{b[key]['bf16_host_us']:.0f}" for b in by_row)
            lines.append(f"| {trees[-1][1]['device']} | {model} {key[0]} | {key[1]} | {row['kernel']} | {trit} | {bf16} | "
                         f"{row['trit_device_us']:.1f} | {row['bf16_device_us']:.1f} |")
        notes.append(f"{trees[-1][1]['device']}: " + " / ".join(t for t, _ in trees) + _machines(trees))
    recorded = all("gpu_uuid" in d for group in runs.values() for _, d in group)
    lines += ["", "Host us a call: the wall time of 50 calls issued behind a sleep kernel, median of 7 reps, each "
              "tree's figure in the order named (" + "; ".join(notes) + ("" if recorded else
              "; the runs of a GPU on one machine, except the H100's last, 6361492, on a later session's") +
              "; the rows no change touched, format v1's o layer and "
              "bf16, show how far one run of a host differs from the next)" + ("; `!`: the GPU had finished the "
              "sleep before the last call of a rep returned, so the figure may hold time spent waiting for it" if idle
              else "") + "; device us: a CUDA graph of one call, the last tree's, L2-warm. "
              "`benchmarks/results/host-path/*.json` hold the commands."]
    return "\n".join(lines)


def serve_budget() -> str:
    """``trit bench serve`` runs at a small card's memory budget: long context, fp8 KV cache, the peak measured."""
    lines = ["| model | weights | budget (GPU share) | max context | KV cache | KV-cache tokens | peak GPU MiB | "
             "concurrency | prompt + output tokens | output tok/s | TTFT p50 ms | TPOT p50 ms | failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in sorted((RESULTS / "serve-budget").glob("*.json")):
        run = json.loads(f.read_text())
        for sv in run["servers"]:
            if sv["error"] or not sv["levels"]:
                continue
            args = sv["args"]
            for lv in sv["levels"]:
                lines.append(
                    f"| {sv['model']} | {sv['weights']} | {_last_flag(args, '--gpu-memory-utilization')} | "
                    f"{_last_flag(args, '--max-model-len')} | {_last_flag(args, '--kv-cache-dtype', 'auto')} | {sv['kv_cache_tokens']} | "
                    f"{sv['gpu_peak_mib']:.0f} | {lv['concurrency']} | {run['input_len']} + {run['output_len']} | "
                    f"{lv['output_tokens_per_s']:.0f} | {lv['ttft_ms']['median']:.0f} | "
                    f"{lv['tpot_ms']['median']:.2f} | {lv['failed']} |")
    lines += ["", "vLLM's OpenAI server as in the table above, with `--gpu-memory-utilization` set to the share of the "
              "card that a 24 GiB card would give; peak: `nvidia-smi` sampled every half second; "
              "`benchmarks/results/serve-budget/*.json` hold the commands."]
    return "\n".join(lines)


def serve_h100() -> str:
    """``trit bench serve`` runs on an H100, each level as measured, with the invocation (file) it ran in; a trit
    server run under ``TRIT_LAYOUT`` says so."""
    lines = ["| run | model | weights | concurrency | output tok/s | TPOT p50 / p99 ms | TTFT p50 ms | KV-cache tokens | "
             "peak GPU MiB | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
    first = None  # the footer's versions and device: the first file's, as already read
    files = []  # the runs, for the caption's note on their prompts
    for f, run, sv, lv in _serve_levels("serve-h100"):
        first = first or run
        if f"serve-h100/{f.name}" not in files:
            files.append(f"serve-h100/{f.name}")
        peak = f"{sv['gpu_peak_mib']:.0f}" if sv.get("gpu_peak_mib") else "-"
        layout = run.get("env", {}).get("TRIT_LAYOUT")
        weights = f"trit (`TRIT_LAYOUT={layout}`)" if layout and sv["weights"] == "trit" else sv["weights"]
        tpot, ttft = lv["tpot_ms"], lv["ttft_ms"]
        lines.append(f"| `{f.name}` | {sv['model']} | {weights} | {lv['concurrency']} | "
                     f"{lv['output_tokens_per_s']:.0f} | "
                     f"{_or_dash(tpot.get('median'), '.2f')} / {_or_dash(tpot.get('p99'), '.2f')} | "
                     f"{_or_dash(ttft.get('median'), '.0f')} | {sv.get('kv_cache_tokens') or '-'} | {peak} | "
                     f"{lv['failed']} |")
    lines += ["", f"vLLM {first['versions'].get('vllm', '?')} OpenAI server (multiprocess engine, CUDA graphs), dummy "
              f"weights, {first['input_len']} + {first['output_len']} tokens a request, vLLM's serving client, "
              f"{first['device']}; `benchmarks/results/serve-h100/*.json` hold the commands; peak: `nvidia-smi` (`-`: "
              "the run was cut short before it was recorded)"
              + _prompt_note(files) + "."]
    return "\n".join(lines)


def _lm_head(run: dict) -> str:
    """The lm_head a ``trit bench serve`` run's trit servers loaded: its recorded ``TRIT_LM_HEAD``, else (unset or
    empty, as the loader takes it) the checkpoint's, which the benchmark's models leave stored."""
    return run.get("env", {}).get("TRIT_LM_HEAD") or "stored"


def plan_vllm() -> str:
    """``trit plan``'s ledger for each trit server of the serve runs, at the KV cache vLLM allocated, against the
    server's measured peak (vLLM fills its memory share with KV cache, so the plan is asked for that many tokens;
    the KV term then matches by construction, and the column without it is the part the plan estimates)."""
    import tempfile

    sys.path.insert(0, str(SRC))
    from trit.bench.serve import model_config
    from trit.eval.plan import DEFAULT_MAX_BATCHED_TOKENS, GiB, PlanOptions, plan

    lines = ["| run | model | KV cache | KV-cache tokens (vLLM) | max-num-seqs | "
             "plan: weights + KV + activations + overhead, GiB | "
             "plan / measured peak, GiB | error | without the KV cache: plan / measured, GiB | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for f in sorted(RESULTS.glob("serve*/*.json")):
        run = json.loads(f.read_text())
        head = _lm_head(run)
        for sv in run["servers"]:
            if sv["weights"] != "trit" or not sv.get("kv_cache_tokens") or not sv.get("gpu_peak_mib"):
                continue
            kv = _last_flag(sv["args"], "--kv-cache-dtype", "auto")
            batched = int(_last_flag(sv["args"], "--max-num-batched-tokens", str(DEFAULT_MAX_BATCHED_TOKENS)))
            config = model_config(sv["model"], "trit")
            if head != "stored":
                config["quantization_config"]["lm_head"] = head
            with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ):
                os.environ.pop("TRIT_LM_HEAD", None)  # the run's head (in the config), not this shell's
                (Path(d) / "config.json").write_text(json.dumps(config))
                p = plan(d, PlanOptions(batch=1, max_seq_len=sv["kv_cache_tokens"], kv_cache_dtype=kv,
                                        max_batched_tokens=batched))
            peak = sv["gpu_peak_mib"] * 2**20
            parts = " + ".join(f"{b / GiB:.2f}" for b in (sum(p.weights.values()), p.kv_total, p.activations,
                                                           p.overhead))
            rest_plan, rest_peak = p.total - p.kv_total, peak - p.kv_total
            seqs = _last_flag(sv["args"], "--max-num-seqs")
            lines.append(f"| `{f.parent.name}/{f.name}` | {sv['model']} | {kv} | {sv['kv_cache_tokens']} | {seqs} | {parts} | "
                         f"{p.total / GiB:.2f} / {peak / GiB:.2f} | {(p.total - peak) / peak:+.1%} | "
                         f"{rest_plan / GiB:.2f} / {rest_peak / GiB:.2f} | {(rest_plan - rest_peak) / rest_peak:+.1%} |")
    lines += ["", "Plan: `trit plan` on the shape's config (group-64 scales), batch 1 at the KV-cache tokens vLLM "
              f"reported, its default activation estimate ({DEFAULT_MAX_BATCHED_TOKENS} batched tokens) and overhead "
              "(1.5 GiB); peak: the server's `nvidia-smi` peak."]
    return "\n".join(lines)


def serve_plot() -> str:
    """One plot of each serve table's runs (``serve/``, ``serve-fresh-h100/``, ``serve-decode-h100/``,
    ``serve-distinct-h100/``, ``serve-sweep-h100/``, ``serve-a8-h100/``): throughput and TPOT against
    concurrency, bf16 and trit."""
    sys.path.insert(0, str(SRC))
    from trit.bench.serve import plot

    wrote = []
    for folder in ("serve", FRESH, DECODE_SERVE, DISTINCT_SERVE, SWEEP_SERVE, A8_SERVE):
        runs, _, by_level = _serve_runs(folder)
        # one server a model and weight kind, holding the level the table shows at each concurrency
        servers = [{"model": model, "weights": w, "levels": [levels[c][w][1] for c in sorted(levels) if w in levels[c]]}
                   for model, levels in by_level.items() for w in ("bf16", "trit")]
        plot({**runs[-1][0], "servers": servers}, RESULTS / folder / "serve.png")
        wrote.append(str(RESULTS / folder / "serve.png"))
    return "wrote " + ", ".join(wrote)


def cpu() -> str:
    """``trit bench cpu``: the native kernel per layer shape, and SmolLM2 end to end against torch and llama.cpp."""
    d = json.loads((RESULTS / "cpu.json").read_text())
    bw = d["copy_bandwidth_bytes_per_s"] / 1e9
    lines = [f"Llama-3-8B layer shapes on {d['threads']} CPU threads ({d['device']}, torch {d['torch']}; copy "
             f"bandwidth {bw:.1f} GB/s in the run), ms a call (median):", "",
             "| layer (N x K) | M | trit (kernel) | GB/s | of copy | torch fp32 | torch bf16 | trit / best float |",
             "|---|---|---|---|---|---|---|---|"]
    for r in d["layers"]:
        lines.append(f"| {r['layer']} ({r['n']}x{r['k']}) | {r['m']} | {r['trit_ms']:.2f} ({r['kernel']}) | "
                     f"{r['trit_gbps']:.1f} | {r['frac_copy_bw']:.0%} | {r['fp32_ms']:.2f} | {r['bf16_ms']:.2f} | "
                     f"x{r['speedup_vs_best_float']:.1f} |")
    lines += ["", *_cpu_models(d)]
    lines += ["", f"`{d['command']}` (`benchmarks/results/cpu.json`)."]
    return "\n".join(lines)


def _cpu_models(d: dict) -> list[str]:
    models = [m for m in d["models"] if "error" not in m]
    if not models:
        return []
    lines = [f"SmolLM2-135M-Instruct end to end on {d['threads']} CPU threads, tokens/s (greedy decode of 64 tokens "
             "after a 64-token prompt; prefill of 512 tokens):", "",
             "| engine | weights | prefill | decode, batch 1 | decode, batch 4 | peak RSS MiB |",
             "|---|---|---|---|---|---|"]
    for m in models:
        b4 = f"{m['decode_tok_s_b4']:.1f}" if m.get("decode_tok_s_b4") else "-"
        prefill = f"{m['prefill_tok_s']:.0f}" if m.get("prefill_tok_s") else "-"
        rss = f"{m['peak_rss_mib']:.0f}" if m.get("peak_rss_mib") else "-"
        engine = {"torch": "transformers (torch)", "trit": "trit runtime"}.get(m["engine"], m["engine"])
        weights = {"bf16": "bf16 (computed in float32)", "trit": "ternary, group 64"}.get(m["weights"], m["weights"])
        lines.append(f"| {engine} | {weights} | {prefill} | {m['decode_tok_s_b1']:.1f} | {b4} | {rss} |")
    return lines


def cpu_models() -> str:
    """The README's CPU table: SmolLM2 end to end, torch float against trit and llama.cpp."""
    d = json.loads((RESULTS / "cpu.json").read_text())
    return "\n".join([*_cpu_models(d), "", f"{d['device']}; `{d['command']}` (`benchmarks/results/cpu.json`)."])


LLAMA_CPP_RUN = "cpu_llama_cpp.json"


def llama_cpp_gguf() -> str:
    """docs/gguf.md: llama.cpp on trit's exported GGUF files against its Q4_1, per model, in one ``trit bench cpu``."""
    d = json.loads((RESULTS / LLAMA_CPP_RUN).read_text())
    rows = [m for m in d["models"] if str(m.get("engine", "")).startswith("llama.cpp") and "error" not in m]
    q4 = {m["model"]: m for m in rows if m["weights"].startswith("Q4_1")}
    out = ["| model | llama.cpp weights | decode tok/s (batch 1) | x Q4_1 | prefill tok/s | peak RSS MiB |",
           "|---|---|---|---|---|---|"]
    for m in rows:
        base = q4.get(m["model"])
        ratio = f"x{m['decode_tok_s_b1'] / base['decode_tok_s_b1']:.2f}" if base else "-"
        out.append(f"| {m['model']} | {m['weights']} | {m['decode_tok_s_b1']:.1f} | {ratio} | "
                   f"{m['prefill_tok_s']:.0f} | {m['peak_rss_mib']:.0f} |")
    return "\n".join([*out, "", f"{d['device']}, {d['threads']} threads, {rows[0]['engine']}; `{d['command']}` "
                       f"(`benchmarks/results/{LLAMA_CPP_RUN}`)."])


def domains() -> str:
    """``benchmarks/quality_domains.py``: a table per run (``quality_domains_*.json``), each against its own bf16."""
    return "\n\n".join(_domains_run(f) for f in sorted(RESULTS.glob("quality_domains_*.json"), reverse=True))


# the README's rows: (label, run file, variant), each against the bf16 row of its own run
HEADLINE_DOMAINS = (
    ("bf16", "quality_domains_h200_rotate.json", "bf16"),
    ("naive rounding (`--method absmean`, BitNet's rule)", "quality_domains_cpu.json", "absmean"),
    ("one plane, the default (`trit quantize MODEL OUT`: the residual stream rotated, 128 sampled windows), H200",
     "quality_domains_h200_rotate.json", "gptq"),
    ("one plane, the default, on the CPU", "quality_domains_cpu_rotate.json", "gptq-rotate"),
    ("one plane, not rotated (`--no-rotate`, the default before; the CPU run's windows)",
     "quality_domains_cpu_batch64.json", "gptq"),
    ("two planes, rotated (`--planes 2`), H200", "quality_domains_h200_rotate.json", "gptq-2planes-rotate"),
    ("two planes, not rotated (`--planes 2 --no-rotate --calib-batch 8`)",
     "quality_domains_cpu_2planes_128samples.json", "gptq-2planes"),
    ("one plane healed, data-free, the default (`trit heal OUT HEALED --teacher MODEL --no-grad-checkpointing`: "
     "4096 sequences the teacher samples from BOS and a random token; the run named `--sample-batch 1024`; from "
     "the one-plane default), H100",
     "quality_domains_h100_heal_defaults.json", "healed-random-first-4096"),
    ("one plane healed, the default before (`--sample-first bos --train-samples 2048`), H200",
     "quality_domains_h200_rotate.json", "healed"),
    ("W4A8, int4 groups of 64 (`--scheme w4a8 --group-size 64`, rotated: the default)",
     "quality_domains_cpu_w4a8_rotate.json", "w4a8-g64-rotate"),
)
DOMAIN_HEAD = ("geo. mean (x bf16)", "bits a weight")


def _domain_cells(row: dict, bf16: dict | None, corpora: list[str]) -> list[str]:
    """Perplexity per corpus, the geometric mean (each with its ratio to ``bf16`` when there is one) and bits a
    weight: the cells :data:`DOMAIN_HEAD` names after one column per corpus."""
    def cell(value: float, base: float | None) -> str:
        return f"{value:.4g}" + (f" (x{value / base:.3g})" if base else "")

    cells = [cell(row["perplexity"][c], bf16 and bf16["perplexity"][c]) for c in corpora]
    cells.append(cell(row["geometric_mean"], bf16 and bf16["geometric_mean"]))
    cells.append(f"{row['bits_per_weight']:.2f}" if row.get("bits_per_weight") else "16 (bf16)")
    return cells


def _labelled_rows(spec: tuple[tuple[str, str, str], ...]) -> tuple[list[str], str]:
    """A per-domain table of ``(label, run file, variant)`` rows, each against its own run's bf16 row (a variant
    the run did not finish: a row of dashes); and the evaluation's description, from the first run."""
    runs = {name: json.loads((RESULTS / name).read_text()) for _, name, _ in spec}
    corpora = runs[spec[0][1]]["corpora"]
    head = ["weights", *[f"{c} ppl (x bf16)" for c in corpora], *DOMAIN_HEAD, "run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, name, variant in spec:
        rows = {r["variant"]: r for r in runs[name]["rows"]}
        if variant not in rows:
            lines.append(f"| {label} | " + " | ".join(["-"] * (len(corpora) + 2)) + f" | `{name}`: not finished |")
            continue
        lines.append("| " + " | ".join([label, *_domain_cells(rows[variant], rows["bf16"], corpora), f"`{name}`"]) +
                     " |")
    return lines, runs[spec[0][1]]["eval"].capitalize()


def domains_headline() -> str:
    """The README's per-domain table: the rows of :data:`HEADLINE_DOMAINS`, from runs of
    ``benchmarks/quality_domains.py`` on the H200 or the CPU."""
    lines, evaluated = _labelled_rows(HEADLINE_DOMAINS)
    lines += ["", f"{evaluated}; SmolLM2-135M-Instruct, quantized and "
              "scored on one H200, one H100 or this project's 2-core CPU (the run's name says which); each row "
              "against the bf16 row of its own run; every run's command is in its file (`benchmarks/results/`), the "
              "rows of each run in docs/quantization.md."]
    return "\n".join(lines)


# the same-bits comparison (issue: quality per bit): one recipe (the demo's CPU budget: 16 WikiText windows, one
# pass), each row a way to spend about the same bits: (label, run file, variant)
SAME_BITS = (
    ("bf16", "quality_domains_cpu_bits_relative.json", "bf16"),
    ("ternary, one plane", "quality_domains_cpu_bits_relative.json", "gptq-demo"),
    ("int2 with zero points, groups of 64 (trit's GPTQ, the same recipe; `benchmarks/int2_gptq.py`)",
     "quality_domains_cpu_same_bits.json", "int2-g64-demo"),
    ("ternary, a bits budget of 2.5 (`--bits 2.5`)", "quality_domains_cpu_bits_fisher_demo.json", "gptq-bits2.5-demo"),
    ("ternary, a bits budget of 2.5, the unweighted rule (the drop in squared output error)",
     "quality_domains_cpu_bits.json", "gptq-bits2.5-demo"),
    ("ternary, a bits budget of 2.5, the first rule (the drop relative to each group's output energy)",
     "quality_domains_cpu_bits_relative.json", "gptq-bits2.5-demo"),
    ("ternary, a bits budget of 3.0 (`--bits 3.0`)", "quality_domains_cpu_bits3_fisher_demo.json", "gptq-bits3-demo"),
    ("ternary, a bits budget of 3.0, the unweighted rule", "quality_domains_cpu_bits.json", "gptq-bits3-demo"),
    ("ternary, a bits budget of 3.0, the first rule", "quality_domains_cpu_bits_relative.json", "gptq-bits3-demo"),
    ("W4A8, trit (`--scheme w4a8 --group-size 64`)", "quality_domains_cpu_same_bits.json", "w4a8-g64-demo"),
    ("W4A8, llm-compressor's `oneshot` GPTQ on the same windows (`benchmarks/llmcompressor_w4a8.py`)",
     "quality_domains_cpu_same_bits.json", "llmcompressor-w4a8-g64-demo"),
    ("ternary, two planes (`--planes 2`)", "quality_domains_cpu_bits_relative.json", "gptq-2planes-demo"),
)


def same_bits() -> str:
    """Ways to spend the bits, on one calibration recipe: the rows of :data:`SAME_BITS`, in order of bits."""
    lines, evaluated = _labelled_rows(SAME_BITS)

    def geo_ratio(name: str, variant: str) -> float:
        rows = {r["variant"]: r for r in json.loads((RESULTS / name).read_text())["rows"]}
        return rows[variant]["geometric_mean"] / rows["bf16"]["geometric_mean"]

    _, default_file, default_variant = HEADLINE_DOMAINS[2]  # the one-plane default's row of the README
    lines += ["", f"{evaluated}; SmolLM2-135M-Instruct on this project's 2-core "
              "CPU; every quantized row calibrated on the same 16 windows of WikiText-2's calibration half with one "
              "GPTQ pass (`trit demo`'s CPU budget, not the default recipe: one plane is "
              f"x{geo_ratio(*SAME_BITS[1][1:]):.3g} here, x{geo_ratio(default_file, default_variant):.3g} with the "
              "default's); each row against the bf16 row of its own run; the commands are in the files. "
              + SAME_BITS_FOOTNOTE]
    return "\n".join(lines)


SAME_BITS_FOOTNOTE = ("int2 is scored as its dequantized weights (trit has no int2 format); its bits count an fp16 "
                      "scale and a 2-bit zero point a group; llm-compressor wrote its scales in float32 (it quantized "
                      "the float32 model), so its 4.5 bits as stored would be 4.25 with bf16 scales, as trit's.")


# the ways to spend the bits on the default recipe (data-free GPTQ: 128 sampled windows, rotated), in order of
# bits, on the evaluation windows of SAME_BITS; the README's quality table takes these rows
SAME_BITS_DEFAULT = (
    ("bf16", "quality_domains_cpu_rotate.json", "bf16"),
    ("ternary, one plane, the default (`trit quantize`)", "quality_domains_cpu_rotate.json", "gptq-rotate"),
    ("int2 with zero points, groups of 64 (trit's GPTQ on the same windows; `benchmarks/int2_gptq.py`)",
     "quality_domains_cpu_int2_default.json", "int2-g64"),
    ("ternary, one plane, healed (`trit heal`), H100", "quality_domains_h100_heal_defaults.json",
     "healed-random-first-4096"),
    ("ternary, a bits budget of 2.5 (`--bits 2.5`)", "quality_domains_cpu_bits_fisher.json", "gptq-bits2.5"),
    ("ternary, a bits budget of 2.5, the unweighted rule before", "quality_domains_cpu_bits_default.json",
     "gptq-bits2.5"),
    ("ternary, a bits budget of 2.5 by the rule before, healed, H100", "quality_domains_h100_healed_bits.json",
     "healed-bits2.5"),
    ("ternary, a bits budget of 3.0 (`--bits 3.0`)", "quality_domains_cpu_bits3_fisher.json", "gptq-bits3"),
    ("ternary, a bits budget of 3.0, the unweighted rule before", "quality_domains_cpu_bits_default.json",
     "gptq-bits3"),
    ("W4A8, trit (`--scheme w4a8`)", "quality_domains_cpu_w4a8_rotate.json", "w4a8-g64-rotate"),
    ("W4A8, llm-compressor's `oneshot` GPTQ on the same windows (`benchmarks/llmcompressor_w4a8.py`)",
     "quality_domains_cpu_llmcompressor_default.json", "llmcompressor-w4a8-g64"),
    ("ternary, two planes (`--planes 2`), H200", "quality_domains_h200_rotate.json", "gptq-2planes-rotate"),
)


def same_bits_default() -> str:
    """Ways to spend the bits on the default recipe: the rows of :data:`SAME_BITS_DEFAULT`."""
    lines, evaluated = _labelled_rows(SAME_BITS_DEFAULT)
    lines += ["", f"{evaluated}; SmolLM2-135M-Instruct, quantized and scored on this project's 2-core CPU unless "
              "the row names a GPU, each quantized row calibrated by the default recipe (the residual stream "
              "rotated, GPTQ on 128 windows sampled from the model: the CPU runs share theirs, a GPU run sampled its "
              "own; healed rows: heal's defaults on top); each row against the bf16 row of its own run; the "
              "commands are in the files. " + SAME_BITS_FOOTNOTE]
    return "\n".join(lines)


# the README's speed table: kernel runs of one card (each a setting: bf16 or int8 activations; a setting's later
# files, runs of some M after a retune, give those columns), and the serve sweep of that card; the model whose four
# layer shapes are summed
README_KERNELS = (("kernels_h100_m512.json",), ("kernels_a8_g64_h100.json",),
                  ("kernels_a8_row_h100.json", "kernels_a8_row_m64_h100.json"))
README_SERVE = SWEEP_SERVE
README_MODEL = "llama3-8b"
README_COLUMNS = (1, 16, 64, 256, 2048)


def _speed_row(label: str, by: dict[str, float]) -> str:
    """A row of the README's speed table: ``by``'s ratio for the README model at each column, "-" where none."""
    keys = [f"{README_MODEL} M={m}" for m in README_COLUMNS]
    return f"| {label} | " + " | ".join(f"x{by[k]:.2f}" if k in by else "-" for k in keys) + " |"


def readme_speed() -> str:
    """The README's one speed table: kernels summed over a model's four layers (trit, and the peers each run timed)
    and vLLM serving, each against bf16 on the same card."""
    lines = [f"| {README_MODEL}, x bf16 | " + " | ".join(str(c) for c in README_COLUMNS) + " |",
             "|---|" + "---|" * len(README_COLUMNS)]
    cards, files = set(), []
    for names in README_KERNELS:
        sums: dict[str, float] = {}
        peers: dict[str, dict[str, float]] = {}
        for name in names:  # a later file's columns over an earlier one's, trit's and its peers' alike
            d = json.loads((RESULTS / name).read_text())
            cards.add(d["device"])
            files.append(f"`{name}`")
            sums.update(d["summed_speedup_vs_bf16"])
            for peer, by in d.get("peers_summed_speedup_vs_bf16", {}).items():
                peers.setdefault(f"{peer.replace('_', ' ')} ({d['peer_versions'].get('humming', '')})", {}).update(by)
        act = "W1.58A8 (int8 activations)" if d.get("activations") == "int8" else "bf16 activations"
        g = d.get("group_size", 64)
        scale = "one scale a row" if g == -1 else f"groups of {g}"
        lines.append(_speed_row(f"kernels, trit, {act}, {scale} (M rows)", sums))
        lines += [_speed_row(f"kernels, {peer}", by) for peer, by in peers.items()]
    for folder, label in ((README_SERVE, "trit, bf16 activations, groups of 64"),
                          (A8_SERVE, "trit, W1.58A8, one scale a row")):
        levels: dict[int, dict[str, float]] = {}
        for f, run, sv, lv in _serve_levels(folder):
            if sv["model"] == README_MODEL and lv.get("output_tokens_per_s"):
                cards.add(run["device"])
                files.append(f"`{folder}/{f.name}`")
                levels.setdefault(lv["concurrency"], {})[sv["weights"]] = lv["output_tokens_per_s"]
        lines.append(f"| vLLM serving, {label} (concurrency) | " + " | ".join(
            f"x{levels[c]['trit'] / levels[c]['bf16']:.2f}" if {"trit", "bf16"} <= set(levels.get(c, {})) else "-"
            for c in README_COLUMNS) + " |")
    lines += ["", f"{', '.join(sorted(c for c in cards if c))}; bf16 cuBLAS time / the kernel's time, CUDA graphs, "
              "weights rotated past the L2; vLLM 0.25.1's OpenAI server, output tokens a second, 512-token prompts "
              "no server had seen, 256 tokens out. A row of two kernel files takes the columns the later one "
              f"measured from it. Files: {', '.join(dict.fromkeys(files))} "
              "(`benchmarks/results/`, each with its command); `-`: not measured."]
    return "\n".join(lines)


def _same_bits_row(label: str, name: str, variant: str) -> tuple[str, str, str]:
    """A README row that is one of :data:`SAME_BITS_DEFAULT`'s, named by its run file and variant (not by
    position, which a row added above would shift)."""
    if not any(row[1:] == (name, variant) for row in SAME_BITS_DEFAULT):
        raise ValueError(f"{name} {variant}: not a row of SAME_BITS_DEFAULT")
    return label, name, variant


# the README's quality table: every way to spend the bits on the default recipe, in order of bits, the default in
# bold (label, run file, variant): SAME_BITS_DEFAULT's rows, with the H200's runs of the one- and two-plane defaults
README_DOMAINS = (
    ("bf16", "quality_domains_h200_rotate.json", "bf16"),
    ("naive rounding (BitNet's absmean rule)", "quality_domains_cpu.json", "absmean"),
    ("**one plane, the default** (`trit quantize`)", "quality_domains_h200_rotate.json", "gptq"),
    _same_bits_row("int2 with zero points, groups of 64 (trit's GPTQ, the default recipe)",
                   "quality_domains_cpu_int2_default.json", "int2-g64"),
    _same_bits_row("one plane, healed (`trit heal`, on a GPU)", "quality_domains_h100_heal_defaults.json",
                   "healed-random-first-4096"),
    _same_bits_row("a bits budget of 2.5 (`--bits 2.5`)", "quality_domains_cpu_bits_fisher.json", "gptq-bits2.5"),
    _same_bits_row("a bits budget of 2.5, healed (layers chosen by the unweighted rule before)",
                   "quality_domains_h100_healed_bits.json", "healed-bits2.5"),
    _same_bits_row("a bits budget of 3.0 (`--bits 3.0`)", "quality_domains_cpu_bits3_fisher.json", "gptq-bits3"),
    _same_bits_row("int4 W4A8 (`--scheme w4a8`)", "quality_domains_cpu_w4a8_rotate.json", "w4a8-g64-rotate"),
    _same_bits_row("int4 W4A8, llm-compressor's `oneshot` GPTQ (the default recipe's windows)",
                   "quality_domains_cpu_llmcompressor_default.json", "llmcompressor-w4a8-g64"),
    ("two planes (`--planes 2`)", "quality_domains_h200_rotate.json", "gptq-2planes-rotate"),
)


def readme_quality() -> str:
    """The README's one quality table: the default and the other ways to spend the bits, on three domains, each
    row against its own run's bf16."""
    runs = {name: json.loads((RESULTS / name).read_text()) for _, name, _ in README_DOMAINS}
    corpora = runs[README_DOMAINS[0][1]]["corpora"]
    lines = ["| SmolLM2-135M-Instruct | bits a weight | " + " | ".join(f"{c} (x bf16)" for c in corpora)
             + " | geo. mean | machine |", "|---|---|" + "---|" * (len(corpora) + 2)]
    for label, name, variant in README_DOMAINS:
        rows = {r["variant"]: r for r in runs[name]["rows"]}
        row, bf16 = rows[variant], rows["bf16"]
        bits = f"{row['bits_per_weight']:.2f}" if row.get("bits_per_weight") else "16"
        ratios = [f"x{row['perplexity'][c] / bf16['perplexity'][c]:.3g}" for c in corpora]
        machine = "CPU" if "_cpu" in name else "H100" if "_h100" in name else "H200"
        lines.append(f"| {label} | {bits} | " + " | ".join(ratios)
                     + f" | x{row['geometric_mean'] / bf16['geometric_mean']:.3g} | {machine} |")
    lines += ["", "Perplexity over bf16's on the first 16 windows of 512 tokens of each corpus's evaluation half; "
              "every run's command is in its file (`benchmarks/results/quality_domains_*.json`); "
              "[docs/results.md](docs/results.md) has every row."]
    return "\n".join(lines)


def _domains_run(path: Path) -> str:
    """Perplexity per domain and its geometric mean, GSM8K where scored, for one run of the script."""
    d = json.loads(path.read_text())
    corpora = d["corpora"]
    gsm = any("gsm8k" in r for r in d["rows"])
    head = ["variant", *[f"{c} ppl (x bf16)" for c in corpora], *DOMAIN_HEAD, "MiB"]
    head += ["GSM8K exact match (flexible)"] if gsm else []
    bf16 = next((r for r in d["rows"] if r["variant"] == "bf16"), None)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in d["rows"]:
        cells = [r["variant"], *_domain_cells(r, bf16, corpora), f"{r['size_mib']:.0f}"]
        if gsm:
            g = r.get("gsm8k")
            cells.append("-" if g is None else "error" if "error" in g else
                         f"{g['exact_match']['flexible-extract']:.2f} ± {g['stderr']['flexible-extract']:.2f} "
                         f"(first {g['limit']}, 5-shot)")
        lines.append("| " + " | ".join(cells) + " |")
    commands = "".join(f"{r['variant']}: `{r['command']}`; " for r in d["rows"] if r.get("command"))
    asked = [v for a in re.findall(r"--variants (\S+)", d["command"]) for v in a.split(",")]
    missing = [v for v in asked if v not in {r["variant"] for r in d["rows"]}]
    if missing:
        commands += f"not finished in this run (no row): {', '.join(missing)}; "
    lines += ["", (f"{d['note']} " if d.get("note") else "") +
              f"{d['eval'].capitalize()}; {d['device']} ({d.get('gpu') or d['host']}), torch {d['torch']}; "
              f"calibration checked disjoint from every evaluation window. {commands}"
              f"`{d['command']}` (`benchmarks/results/{path.name}`)."]
    return "\n".join(lines)


def serving() -> str:
    """The headline: Llama-3-8B and Qwen2-1.5B shapes in vLLM, bf16 against trit, by batch."""
    runs = _decode_runs("vllm")
    lines = ["| vLLM 0.25.1, H200 | batch | decode tok/s bf16 | trit | trit / bf16 | peak GiB bf16 / trit |",
             "|---|---|---|---|---|---|"]
    for (model, weights, batch, max_len), t in runs.items():
        b = runs.get((model, "bf16", batch, max_len))
        if weights != "trit" or b is None or max_len != 768 or model == "27b":
            continue
        lines.append(f"| {model} | {batch} | {b['decode_tokens_per_s']:.0f} | {t['decode_tokens_per_s']:.0f} | "
                     f"x{t['decode_tokens_per_s'] / b['decode_tokens_per_s']:.2f} | {b['peak_bytes'] / GiB:.1f} / "
                     f"{t['peak_bytes'] / GiB:.1f} |")
    lines += ["", "`trit bench decode --engines vllm` (random weights, 512-token prompts, 256 new tokens, CUDA graphs; "
              "`benchmarks/results/decode/vllm*.json`)."]
    return "\n".join(lines)


def decode() -> str:
    sys.path.insert(0, str(SRC))
    from trit.bench.decode import plan_for

    vllm, rt, comp = _decode_runs("vllm"), _decode_runs("runtime"), _decode_runs("compiled")
    meta = json.loads((DECODE / "runtime.json").read_text())
    lines = [f"One {meta['device']}, random weights, prompt 512, 256 new tokens, greedy; decode tok/s = batch / "
             "median step time (each step's tokens copied to the host); trit = ternary, group 64, fp16 scales.", "",
             "**vLLM 0.25.1 (trit plugin, CUDA graphs, dummy weights):**", ""]
    lines += _speed_table(vllm, with_ttft=False)
    lines += ["", "**The seeds' scenarios on this GPU** (a seed's target: Qwen2-1.5B on a 24 GB A10 with P99 < 350 ms "
              "a token, < 18 GB, >= 22 tok/s; a 27B ternary model at 18.7 tok/s on a 4090). vLLM's peak holds a KV "
              "cache sized for batch 64:", "",
              "| scenario | engine | P99 ms a token bf16 / trit | peak GiB bf16 / trit | decode tok/s bf16 / trit |",
              "|---|---|---|---|---|"]
    for model, batch in (("qwen2-1.5b", 1), ("qwen2-1.5b", 4), ("27b", 1), ("27b", 4)):
        for engine, runs in (("vLLM", vllm), ("runtime", rt)):
            b, t = runs[(model, "bf16", batch, 768)], runs[(model, "trit", batch, 768)]
            lines.append(f"| {model} batch {batch}, 512 + 256 tokens | {engine} | {b['tpot_p99_ms']:.2f} / "
                         f"{t['tpot_p99_ms']:.2f} | {b['peak_bytes'] / GiB:.1f} / {t['peak_bytes'] / GiB:.1f} | "
                         f"{b['decode_tokens_per_s']:.0f} / {t['decode_tokens_per_s']:.0f} |")
    for r in (r for r in rt.values() if r["max_len"] > 768):
        lines.append(f"| {r['model']} batch {r['batch']}, {r['prompt']} + {r['new_tokens']} tokens | runtime | - / "
                     f"{r['tpot_p99_ms']:.2f} | - / {r['peak_bytes'] / GiB:.1f} | - / {r['decode_tokens_per_s']:.0f} |")
    lines += ["", "**trit's runtime (transformers 5.17 model, static KV cache, CUDA-graph steps, no compile):**", ""]
    lines += _speed_table(rt, with_ttft=True)
    lines += ["", "**trit's runtime with the step compiled (`--compile`):**", ""]
    lines += _speed_table(comp, with_ttft=False)

    def ratio(runs, model, batch):
        return runs[(model, "trit", batch, 768)]["decode_tokens_per_s"] / runs[(model, "bf16", batch, 768)][
            "decode_tokens_per_s"]

    v8, r8 = vllm[("llama3-8b", "trit", 1, 768)], comp[("llama3-8b", "trit", 1, 768)]
    ctx = next(r for r in rt.values() if r["max_len"] > 768)
    plans = [r for r in rt.values() if r["plan_error"] is not None]
    worst = max(plans, key=lambda r: abs(r["plan_error"]))
    lines += ["", "Goals (issue 7), from these files:", "",
              f"- Llama-3-8B shape in vLLM, batch 1: trit {v8['decode_tokens_per_s']:.0f} tok/s, "
              f"x{ratio(vllm, 'llama3-8b', 1):.2f} bf16 (goal x5 and 1000 tok/s: not met); batch 16: "
              f"x{ratio(vllm, 'llama3-8b', 16):.2f} (goal x3: not met).",
              f"- Runtime (compiled) at batch 1: {r8['decode_tokens_per_s']:.0f} tok/s, vLLM's trit figure is "
              f"x{v8['decode_tokens_per_s'] / r8['decode_tokens_per_s']:.2f} of it (goal within x1.5).",
              f"- 27B shape, {ctx['max_len']}-token context, batch 1 (runtime): {ctx['peak_bytes'] / GiB:.2f} GiB "
              "peak (goal < 10 GB: not met); `trit plan` for it with one scale per row and an fp8 KV cache: "
              f"{plan_for(ctx['model'], 1, ctx['max_len'], ctx['prompt'], group=-1, kv_cache_dtype='fp8') / GiB:.2f}"
              " GiB (a ledger, not measured).",
              f"- `trit plan` against the runtime's measured peaks: {len(plans)} runs, errors from "
              f"{min(r['plan_error'] for r in plans):+.0%} to {max(r['plan_error'] for r in plans):+.0%}, "
              f"{sum(abs(r['plan_error']) <= 0.10 for r in plans)} within 10% (worst: {worst['model']} batch "
              f"{worst['batch']}, {worst['plan_error']:+.0%}).", ""]
    lines += ["| trit runtime run | measured peak GiB | trit plan GiB | error |", "|---|---|---|---|"]
    lines += [f"| {r['model']} batch {r['batch']}, {r['max_len']} tokens | {r['peak_bytes'] / GiB:.2f} | "
              f"{r['plan_bytes'] / GiB:.2f} | {r['plan_error']:+.1%} |" for r in plans]
    cold = [w for w in json.loads((DECODE / "runtime.json").read_text())["workers"] if "cache" in w["extra"]]
    warm_v = json.loads((DECODE / "vllm_warm_start.json").read_text())["workers"][0]
    cold_v = next(w for w in _decode_workers("vllm") if (w["model"], w["weights"]) == ("llama3-8b", "trit"))
    lines += ["", "Start-up, Llama-3-8B shape, trit (random weights made on the GPU: no checkpoint read):", ""]
    lines += [f"- runtime, {w['extra']['cache']} Triton cache: first token {w['extra']['to_first_token_s']:.1f} s "
              f"after process start (imports {w['extra']['import_s']:.1f} s, model {w['extra']['build_s']:.1f} s, "
              f"prefill with kernel compiles {w['extra']['prefill_s']:.1f} s)" for w in cold]
    lines += [f"- vLLM engine construction (dummy load, torch.compile, CUDA graph capture): "
              f"{cold_v['init_seconds']:.0f} s on a fresh machine, {warm_v['init_seconds']:.0f} s with warm compile "
              f"caches; that warm engine's first timed request: TTFT {warm_v['runs'][0]['ttft_ms']:.0f} ms."]
    return "\n".join(lines)


def decode_plots() -> str:
    sys.path.insert(0, str(SRC))
    from trit.bench.decode import plot

    for kind in ("vllm", "runtime"):
        meta = json.loads((DECODE / DECODE_FILES[kind][0]).read_text())
        plot({"device": meta["device"], "workers": _decode_workers(kind)}, DECODE / "decode")
    return "wrote " + ", ".join(str(p) for p in sorted(DECODE.glob("decode_*.png")))


TABLES = {"kernels": kernels, "kernels-h100": lambda: kernels("kernels_h100_m512.json"),
          "serve-decode": lambda: serve(DECODE_SERVE), "serve-distinct": lambda: serve(DISTINCT_SERVE),
          "serve-sweep": lambda: serve(SWEEP_SERVE), "serve-a8": lambda: serve(A8_SERVE), "mma": mma, "speedups": speedups, "serving": serving, "serve": serve,
          "serve-fresh": lambda: serve(FRESH), "serve-profile": serve_profile, "serve-head": serve_head, "repack": repack, "host-path": host_path, "lm-head": lm_head, "lm-head-speed": lm_head_speed, "layout-scales": layout_scales, "serve-budget": serve_budget, "serve-h100": serve_h100, "plan-vllm": plan_vllm, "cpu": cpu, "cpu-models": cpu_models, "domains": domains, "domains-headline": domains_headline, "same-bits": same_bits, "same-bits-default": same_bits_default,
          "vllm": vllm, "a8": a8, "ptq": ptq, "quality": quality, "decode": decode, "decode-plots": decode_plots,
          "serve-plot": serve_plot, "readme-quality": readme_quality, "readme-speed": readme_speed,
          "llama-cpp-gguf": llama_cpp_gguf}
_BLOCK = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)


HEAL_RESULT = "quality_domains_h100_heal_defaults.json"  # the default heal recipe's run (trit demo's closing line)


def shipped_results() -> dict:
    """The headline results trit ships in its package (``trit/data/results.json``), which ``trit demo`` reads: the
    default heal recipe's run across three domains."""
    run = json.loads((RESULTS / HEAL_RESULT).read_text())
    rows = {r["variant"]: r for r in run["rows"]}
    healed = next(r for r in run["rows"] if "heal" in r)
    steps = healed["command"].split(" && ")
    return {"heal": {
        "command": steps[-1].replace("BASE", "ONE_PLANE").replace("OUT", "HEALED") + " --device cuda",
        "device": run["gpu"], "seconds": healed["heal_seconds"], "bits_per_weight": healed["bits_per_weight"],
        "ratio_to_bf16": healed["ratio_to_bf16"], "geometric_mean_ratio": healed["geometric_mean_ratio"],
        "before_geometric_mean_ratio": rows["gptq"]["geometric_mean_ratio"],
        "source": f"benchmarks/results/{HEAL_RESULT}"}}


def write() -> str:
    """Refresh every marked block of README.md and docs/*.md, and the package's shipped results, from the result
    files."""
    shipped = SRC / "trit" / "data" / "results.json"
    shipped.write_text(json.dumps(shipped_results(), indent=1) + "\n")
    done = [f"{shipped.relative_to(ROOT)}"]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        new = _BLOCK.sub(lambda m: f"{m.group(1)}{TABLES[m.group(2)]()}\n{m.group(4)}", text)
        if new != text:
            path.write_text(new)
        done += [f"{path.relative_to(ROOT)}: {name}" for name in dict.fromkeys(m.group(2) for m in _BLOCK.finditer(text))]
    return "\n".join(done)


if __name__ == "__main__":
    print(write() if sys.argv[1] == "--write" else TABLES[sys.argv[1]]())
