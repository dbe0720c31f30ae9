"""Typed configs, one frozen dataclass a scheme: the only options type of the package (torchao's shape).

The type says what is made: :class:`AbsmeanConfig`, :class:`TWNConfig` and :class:`GPTQConfig` make a
ternary checkpoint, :class:`W4A8Config` an int4-weight, int8-activation one; :class:`Layout` holds what
does not depend on the method (layers kept, padding, scale dtype, the served output layer and activations);
:class:`HealConfig` a distillation; :class:`CalibConfig` the calibration data the calibrated schemes share.
``trit quantize`` and ``trit heal`` parse their flags into these, the Python API takes them, and the
converter, the W4A8 writer and heal read them. Every default is the recipe the measured results used
(docs/quantization.md has the measurements); research knobs live here too, below the common fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from trit import compressed
from trit import format as fmt
from trit.errors import ConfigError
from trit.quant import Method
from trit.quant.gptq import GptqOptions

FIRST = ("bos", "random")  # how a data-free calibration window (or a heal sequence) starts


def _check(config: object, field: str, ok: bool, expected: str) -> None:
    if not ok:
        raise ConfigError(type(config).__name__, field, getattr(config, field), expected)


def _check_int(config: object, field: str, low: int) -> None:
    value = getattr(config, field)
    _check(config, field, isinstance(value, int) and not isinstance(value, bool) and value >= low,
           f"an integer >= {low}")


def _check_group(config: object, channel_ok: bool = False) -> None:
    g = config.group_size
    ok = isinstance(g, int) and not isinstance(g, bool) and (g == fmt.PER_ROW or (g >= 4 and g % 4 == 0))
    _check(config, "group_size", ok, ("'channel' (-1)" if channel_ok else "-1 (one scale a row)")
           + " or a positive multiple of 4")


def _check_device(config: object) -> None:
    """A device torch can name (``cpu``, ``cuda``, ``cuda:1``): checked before any work, and CUDA where it is."""
    device = config.device
    if device is None:
        return
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        _check(config, "device", False, "a device torch names: cpu, cuda or cuda:N")
    if d.type == "cuda" and not torch.cuda.is_available():
        _check(config, "device", False, "a device this machine has (no CUDA GPU is available here)")
    _check(config, "device", d.type in ("cpu", "cuda"), "cpu or cuda")


def _check_gptq(config: object) -> None:
    _check(config, "damp", isinstance(config.damp, int | float) and config.damp == config.damp and config.damp >= 0,
           "a damping >= 0 (a fraction of the Hessian's mean diagonal)")
    _check_int(config, "passes", 1)


@dataclass(frozen=True)
class CalibConfig:
    """Calibration data of the calibrated schemes (GPTQ, W4A8)."""

    file: Path | str | None = None  # a text file or a built-in corpus name; None: sampled from the float model
    samples: int = 128
    seq_len: int = 512
    seed: int = 0
    batch: int = 64  # data-free: windows the float model samples at once
    first: str = "random"  # data-free: windows start from BOS and a random token, or from BOS alone ("bos")
    cache: bool = True  # data-free: keep the sampled windows in $TRIT_CACHE/calib and reuse them

    def __post_init__(self) -> None:
        _check(self, "first", self.first in FIRST, f"one of {', '.join(FIRST)}")
        _check_int(self, "samples", 1)
        _check_int(self, "seq_len", 2)
        _check_int(self, "batch", 1)


@dataclass(frozen=True)
class Layout:
    """What a ternary checkpoint holds whatever the method: layers kept in high precision (names or globs), the
    padding of a K no group divides, the scales' dtype, how it is served (``lm_head``: the output layer as stored
    or as int8 rows; ``activations``: as they are, or rounded to int8 per token, W1.58A8)."""

    keep: tuple[str, ...] = ()
    pad_policy: fmt.PadPolicy = fmt.PadPolicy.PAD
    scale_dtype: fmt.ScaleDtype = fmt.ScaleDtype.FLOAT16
    lm_head: str = "stored"
    activations: fmt.ActivationQuant = fmt.ActivationQuant.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "pad_policy", fmt.PadPolicy(self.pad_policy))
        object.__setattr__(self, "scale_dtype", fmt.ScaleDtype(self.scale_dtype))
        object.__setattr__(self, "activations", fmt.ActivationQuant(self.activations))
        _check(self, "lm_head", self.lm_head in fmt.LM_HEADS, f"one of {', '.join(fmt.LM_HEADS)}")


class _Rotation:
    """``rotate``: the residual stream (and each value head) rotated before rounding (:mod:`trit.quant.rotate`):
    the same function, weights and activations without outlier channels; a tied lm_head becomes the model's own.
    ``None``: the scheme's default (on for the calibrated schemes, where it measured better; off for the rules),
    and a model type the rotation does not know is then quantized as it stands; ``True`` refuses such a model."""

    rotate: bool | None
    rotates_by_default = False

    @property
    def rotates(self) -> bool:
        return self.rotate if self.rotate is not None else self.rotates_by_default


@dataclass(frozen=True)
class AbsmeanConfig(_Rotation):
    """Naive rounding by BitNet b1.58's rule (scale = mean |w| a group): instant, and ruinous for a model that was
    not trained ternary. For natively ternary models and comparisons. ``planes=2`` fits two planes jointly, as
    :class:`TWNConfig` does."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1
    rotate: bool | None = None
    device: str = "cpu"  # where the quantizer runs
    method = Method.ABSMEAN

    def __post_init__(self) -> None:
        _check_ternary(self)


@dataclass(frozen=True)
class TWNConfig(_Rotation):
    """Each group's threshold and scale chosen to minimise the squared weight error (exact TWN); data-free.
    ``planes=2`` fits two ternary planes a layer jointly (about 4.5 bits a weight)."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1
    rotate: bool | None = None
    device: str = "cpu"
    method = Method.TWN

    def __post_init__(self) -> None:
        _check_ternary(self)


@dataclass(frozen=True)
class GPTQConfig(_Rotation):
    """Calibrated, Hessian-aware ternary rounding, layer by layer on inputs that went through the layers already
    quantized (the default scheme). ``calib.file``: a text file or corpus; ``None`` samples calibration text from
    the float model (data-free)."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1
    calib: CalibConfig = CalibConfig()
    rotate: bool | None = None
    device: str = "cpu"
    rotates_by_default = True
    # research knobs: the GPTQ settings of every measured result
    damp: float = GptqOptions.damp  # a fraction of mean(diag(H)) added to the diagonal
    act_order: bool = GptqOptions.act_order  # columns by decreasing Hessian diagonal
    passes: int = GptqOptions.passes  # rounding passes, each later one onto the scales the one before refitted
    float_target: bool | None = GptqOptions.float_target  # aim at the float model's outputs (None: one plane)
    # a bits budget: bits a weight the ternary layers store, one plane everywhere and a second plane for the layers
    # where it cuts the output error most per added bit (trit.quant.budget); None: ``planes`` everywhere
    bits: float | None = None
    method = Method.GPTQ

    def __post_init__(self) -> None:
        _check_ternary(self)
        _check_gptq(self)
        _check(self, "bits", self.bits is None or (isinstance(self.bits, int | float) and not isinstance(self.bits, bool)
                                                   and 0 < self.bits < float("inf")), "a number of bits a weight")
        _check(self, "planes", self.bits is None or self.planes == 1, "1 with a bits budget (bits)")

    def gptq(self) -> GptqOptions:
        return GptqOptions(self.group_size, self.planes, self.damp, self.act_order, passes=self.passes,
                           float_target=self.float_target)


def _check_ternary(config: object) -> None:
    _check_group(config)
    _check(config, "planes", config.planes in (1, 2), "1 or 2 (trit-planes a layer)")
    _check_device(config)


TernaryConfig = AbsmeanConfig | TWNConfig | GPTQConfig


@dataclass(frozen=True)
class W4A8Config(_Rotation):
    """int4 GPTQ weights (groups, or one scale a channel: ``compressed.CHANNEL``) and int8 per-token activations,
    written as compressed-tensors for stock vLLM."""

    group_size: int = 64
    calib: CalibConfig = CalibConfig()
    rotate: bool | None = None  # as ternary's: activations without outlier channels before their int8 scale
    device: str = "cpu"
    rotates_by_default = True
    tensor_parallel_size: int = 1  # checked: each rank's slice of a row-parallel layer holds whole groups
    # research knobs
    damp: float = GptqOptions.damp
    act_order: bool = GptqOptions.act_order
    passes: int = 1  # with more, each later pass rounds onto the least-squares scales of the one before

    def __post_init__(self) -> None:
        _check_group(self, channel_ok=True)
        _check_device(self)
        _check_gptq(self)
        _check_int(self, "tensor_parallel_size", 1)

    def gptq(self) -> GptqOptions:
        group = fmt.PER_ROW if self.group_size == compressed.CHANNEL else self.group_size
        return GptqOptions(group, 1, self.damp, self.act_order, refit=self.passes > 1, passes=self.passes,
                           float_target=False, int_bits=compressed.BITS)


QuantConfig = TernaryConfig | W4A8Config


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


@dataclass(frozen=True)
class HealConfig:
    """Distilling the float model back into a one-plane ternary checkpoint (``trit heal``): a first phase with
    the codes fixed, then a main phase with everything but the embeddings training. Data-free by default."""

    steps: int = 3600  # steps of the main phase
    lr: float = 1e-3  # scales and norms (and the latent weights when weight_lr is None)
    batch: int = 16
    seq_len: int = 512
    data: Path | None = None  # training text; None: sequences sampled from the teacher
    train_samples: int | None = None  # None: 4096 sampled by the teacher, or 2048 windows of data
    heldout_samples: int = 16
    eval_every: int = 25
    device: str | None = None
    seed: int = 0
    grad_checkpointing: bool = True
    sample_batch: int | None = None  # sequences the teacher samples at once; None: sampling_batch's rule
    freeze_codes: bool = False  # train the scales and norms only; every ternary code stays as it is
    weight_lr: float | None = 4e-3  # the latent weights and the embeddings (None: lr)
    train_embeddings: bool = False  # the float embeddings and lm_head (tied or not) train too, at weight_lr
    scales_first: int = 600  # steps of the first phase (every code fixed); 0: one phase
    scales_first_lr: float = 3e-3
    compile: bool | None = None  # torch.compile the training step; None: on CUDA only
    mix_sampled: int = 0  # with data: this many teacher-sampled sequences join the text's windows
    sample_first: str = "random"  # how a teacher-sampled sequence starts (FIRST)

    def training_samples(self) -> int:
        """Training sequences: ``train_samples``, else 4096 data-free and 2048 windows of ``data``."""
        if self.train_samples is not None:
            return self.train_samples
        return 4096 if self.data is None else 2048

    def sampling_batch(self, device: str, sequence_bytes: int = 0, free_bytes: int | None = None) -> int:
        """Sequences the teacher samples at once on ``device``: ``sample_batch``; by default 64 on the CPU, and on
        CUDA 512, halved while that many sequences' KV cache (``sequence_bytes`` each) would take more than a
        quarter of the device's ``free_bytes`` (a larger model, a smaller GPU)."""
        if self.sample_batch is not None:
            return self.sample_batch
        if not _is_cuda(device):
            return 64
        batch = 512
        while free_bytes is not None and batch > 1 and batch * sequence_bytes > free_bytes // 4:
            batch //= 2
        return batch

    def compiles(self, device: str) -> bool:
        """Whether a heal on ``device`` compiles its step: ``compile``, or by default on CUDA only."""
        return self.compile if self.compile is not None else _is_cuda(device)
