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

The defaults are those of the command line (``trit quantize --help`` shows
them): calibrated GPTQ, one trit-plane, groups of 64, data-free calibration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trit import format as fmt
from trit.calibrate import CalibOptions
from trit.convert import ConvertOptions, ConvertReport, convert
from trit.quant import Method
from trit.quant.gptq import GptqOptions
from trit.runtime import Loaded, SamplingOptions
from trit.runtime import generate as _generate
from trit.runtime import load as _load


@dataclass(frozen=True)
class AbsmeanConfig:
    """Naive rounding by BitNet b1.58's rule (scale = mean |w| per group): instant, and ruinous for a model that
    was not trained ternary. For natively ternary models and comparisons."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class TWNConfig:
    """Each group's threshold and scale chosen to minimise the squared weight error (exact TWN); data-free.
    ``planes=2`` fits two ternary planes per layer jointly (about 4.5 bits a weight)."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1


@dataclass(frozen=True)
class GPTQConfig:
    """Calibrated, Hessian-aware ternary rounding, layer by layer on inputs that went through the layers already
    quantized. ``calib``: a text file; ``None`` samples calibration text from the float model (data-free)."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1
    calib: Path | None = None
    calib_samples: int = CalibOptions.samples
    calib_seq_len: int = CalibOptions.seq_len
    damp: float = GptqOptions.damp
    act_order: bool = GptqOptions.act_order
    passes: int = GptqOptions.passes
    float_target: bool | None = GptqOptions.float_target
    rotate: bool = True  # the residual stream rotated first (trit.quant.rotate); a tied lm_head becomes its own
    device: str = "cpu"


QuantConfig = AbsmeanConfig | TWNConfig | GPTQConfig


@dataclass(frozen=True)
class Layout:
    """Choices that do not depend on the method: layers kept in high precision, padding, the scale dtype."""

    keep: tuple[str, ...] = ()  # module names or glob patterns kept in high precision
    pad_policy: fmt.PadPolicy = fmt.PadPolicy.PAD
    scale_dtype: fmt.ScaleDtype = fmt.ScaleDtype.FLOAT16


def convert_options(config: QuantConfig, layout: Layout = Layout(), overwrite: bool = False) -> ConvertOptions:
    """The converter's options for a config object (what ``trit quantize``'s flags build too)."""
    if not isinstance(config, AbsmeanConfig | TWNConfig | GPTQConfig):
        raise TypeError(f"expected AbsmeanConfig, TWNConfig or GPTQConfig, found {type(config).__name__}")
    common = dict(group_size=config.group_size, keep=layout.keep, pad_policy=layout.pad_policy,
                  scale_dtype=layout.scale_dtype, overwrite=overwrite)
    if isinstance(config, AbsmeanConfig):
        return ConvertOptions(method=Method.ABSMEAN, **common)
    if isinstance(config, TWNConfig):
        return ConvertOptions(method=Method.TWN, planes=config.planes, **common)
    if isinstance(config, GPTQConfig):
        return ConvertOptions(method=Method.GPTQ, planes=config.planes, device=config.device,
                              calib=CalibOptions(config.calib, config.calib_samples, config.calib_seq_len),
                              act_order=config.act_order, damp=config.damp, passes=config.passes,
                              float_target=config.float_target, rotate=config.rotate, **common)
    raise AssertionError(config)  # unreachable


def quantize(model_dir: str | Path, out_dir: str | Path, config: QuantConfig | None = None, layout: Layout = Layout(),
             overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = print) -> ConvertReport:
    """Make the float checkpoint ``model_dir`` ternary and write it to ``out_dir`` (atomically).

    ``config`` defaults to :class:`GPTQConfig` (data-free calibration). Returns the converter's report: the layers
    padded or kept, and the bits a weight.
    """
    return convert(model_dir, out_dir, convert_options(config or GPTQConfig(), layout, overwrite), progress, log)


def load(path: str | Path, device: str | None = None, dtype=None) -> Loaded:
    """A trit (or float) checkpoint as a transformers model with its tokenizer (:class:`~trit.runtime.Loaded`).

    ``device``: ``"cuda"`` if present, else ``"cpu"``; ``dtype``: bf16 on a GPU, float32 on a CPU. The packed
    codes load as they are (no float copy); a broken checkpoint is refused with the tensor named.
    """
    return _load(path, device=device, dtype=dtype)


def generate(model: Loaded, prompt: str, max_new_tokens: int = SamplingOptions.max_new_tokens, chat: bool = False,
             temperature: float = SamplingOptions.temperature, top_p: float = SamplingOptions.top_p,
             top_k: int = SamplingOptions.top_k, repetition_penalty: float = SamplingOptions.repetition_penalty,
             seed: int | None = None, truncate: bool = False) -> str:
    """The text ``model`` (from :func:`load`) continues ``prompt`` with; greedy unless ``temperature > 0``.

    ``chat`` applies the tokenizer's chat template; ``truncate`` keeps the prompt's last tokens when it leaves
    no room in the context (else it is refused).
    """
    options = SamplingOptions(max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed)
    return _generate(model, prompt, options, chat, truncate)
