"""The Python API at the top of the package: ``trit.quantize``, ``trit.load``, and a config object per method.

A config object says how to make a model ternary (torchao's style: the method is
the config's type); :func:`quantize` converts a float Hugging Face checkpoint
folder with it, and :func:`load` reads a trit (or float) checkpoint into a
transformers model with its tokenizer, ready to generate:

>>> import trit
>>> from trit.synthetic import make_checkpoint
>>> src = make_checkpoint(tmp / "float")  # a tiny random Llama; any Llama-family checkpoint folder works
>>> report = trit.quantize(src, tmp / "ternary", trit.TWNConfig(group_size=32), progress=False, log=print)
quantizing ... twn, group 32, 1 plane(s)
>>> round(report.bits_per_weight, 2)
2.5
>>> model = trit.load(tmp / "ternary", device="cpu")
>>> text = trit.generate(model, "Hello", max_new_tokens=4)
>>> isinstance(text, str)
True

The config objects (:mod:`trit.configs`) are the command line's own: ``trit
quantize`` parses its flags into them, so the defaults are the same
(``trit quantize --help`` shows them): calibrated GPTQ, one trit-plane, groups
of 64, data-free calibration, the residual stream rotated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trit.configs import (
    AbsmeanConfig,
    CalibConfig,
    GPTQConfig,
    HealConfig,
    Layout,
    QuantConfig,
    TernaryConfig,
    TWNConfig,
    W4A8Config,
)
from trit.convert import ConvertReport, convert
from trit.runtime import Loaded, SamplingOptions
from trit.runtime import generate as _generate
from trit.runtime import load as _load
from trit.w4a8 import W4A8Report, quantize_w4a8

__all__ = ["AbsmeanConfig", "CalibConfig", "GPTQConfig", "HealConfig", "Layout", "QuantConfig", "TWNConfig",
           "W4A8Config", "generate", "load", "quantize"]


def quantize(model_dir: str | Path, out_dir: str | Path, config: QuantConfig | None = None, layout: Layout = Layout(),
             overwrite: bool = False, progress: bool = True,
             log: Callable[[str], None] = print) -> ConvertReport | W4A8Report:
    """Make the float checkpoint ``model_dir`` ternary (or W4A8) and write it to ``out_dir`` (atomically).

    ``config`` defaults to :class:`GPTQConfig` (data-free calibration); :class:`W4A8Config` writes int4 weights and
    int8 activations as compressed-tensors (``layout`` is ternary's). Returns the writer's report: the layers
    padded or kept, and the bits a weight.
    """
    config = config or GPTQConfig()
    if isinstance(config, W4A8Config):
        return quantize_w4a8(model_dir, out_dir, config, overwrite, progress, log)
    if not isinstance(config, TernaryConfig):
        raise TypeError(f"expected AbsmeanConfig, TWNConfig, GPTQConfig or W4A8Config, found {type(config).__name__}")
    return convert(model_dir, out_dir, config, layout, overwrite, progress, log)


def load(path: str | Path, device: str | None = None, dtype=None, lm_head: str | None = None,
         activations: str | None = None) -> Loaded:
    """A trit (or float) checkpoint as a transformers model with its tokenizer (:class:`~trit.runtime.Loaded`).

    ``device``: ``"cuda"`` if present, else ``"cpu"``; ``dtype``: bf16 on a GPU, float32 on a CPU. The packed
    codes load as they are (no float copy); a broken checkpoint is refused with the tensor named. ``lm_head``
    (``"stored"``, ``"int8"``) and ``activations`` (``"none"``, ``"int8_per_token"``) override how the checkpoint
    says it is served.
    """
    return _load(path, device=device, dtype=dtype, lm_head=lm_head, activations=activations)


def generate(model: Loaded, prompt: str, max_new_tokens: int = SamplingOptions.max_new_tokens, chat: bool = False,
             temperature: float = SamplingOptions.temperature, top_p: float = SamplingOptions.top_p,
             top_k: int = SamplingOptions.top_k, repetition_penalty: float = SamplingOptions.repetition_penalty,
             seed: int | None = None, truncate: bool = False) -> str:
    """The text ``model`` (from :func:`load`) continues ``prompt`` with; greedy unless ``temperature > 0``.

    ``chat`` applies the tokenizer's chat template; ``truncate`` keeps the prompt's last tokens when it leaves
    no room in the context (else it is refused).
    """
    if not isinstance(model, Loaded):
        raise TypeError(f"model: expected what trit.load returns (trit.Loaded), found {type(model).__name__}")
    options = SamplingOptions(max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed)
    return _generate(model, prompt, options, chat, truncate)
