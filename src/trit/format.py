"""The trit checkpoint format, version 1: the on-disk and in-memory contract.

Everything that reads or writes ternary weights goes through this file: the
quantization config, the bit layout, ``pack``/``unpack`` and the checks that
refuse anything else with a :class:`FormatError` naming the tensor.

The bit layout
--------------
A ternary weight ``W`` of shape ``(N, K)`` (N outputs, K inputs, as in
``nn.Linear``), each ``w`` in {-1, 0, +1}, is stored as codes ``c = w + 1`` in
{0, 1, 2}, two bits each, packed along K, four to a byte::

    packed[n, j]   (uint8, shape (N, K_pad // 4), row-major; j = k // 4)

      bit   7   6   5   4   3   2   1   0
           [ k=4j+3 ][ k=4j+2 ][ k=4j+1 ][ k=4j   ]

so weight ``k`` sits in bits ``2 * (k % 4)`` of byte ``k // 4``. Read as
little-endian int32 words (when ``K_pad % 16 == 0``), word ``k // 16`` holds
weight ``k`` in bits ``2 * (k % 16)``: the same bytes, the view GPU kernels load.
The code value 3 never appears in a valid file.

Scales are ``(N, K_pad // group_size)`` in fp16 (or bf16; float32 where an
imported scale has no exact 16-bit form, see :mod:`trit.import_bitnet`), one per group of
``group_size`` consecutive inputs of a row; ``group_size = -1`` means one scale
per row (:data:`PER_ROW`), shape ``(N, 1)``. The dequantized weight is ``(c - 1) * scale``
(:func:`dequantize`, the one implementation every other path is checked against).

``K_pad`` is K rounded up to a multiple of the group size (and of 4). Layers
whose K is not such a multiple are padded with zero weights (code 1) by the
converter, or kept in high precision: the config says which policy was used,
and the true K comes from the model config (the layer's ``in_features``).

Tensor names: ``<layer>.weight_packed``, ``<layer>.weight_scale`` beside the
usual ``<layer>.bias``. A checkpoint with ``planes = 2`` (trit-planes: ``W =
a1 * T1 + a2 * T2``) stores the second plane beside the first, in the same
layout, as ``<layer>.weight_packed_2`` and ``<layer>.weight_scale_2``; the
layer's output is the sum of the two ternary matmuls. ``config.json`` holds::

    "quantization_config": {"quant_method": "trit", "format_version": 1,
                            "group_size": 64, "scale_dtype": "float16",
                            "method": "absmean", "modules_not_converted": [...]}

The format follows the ternary weights of BitNet b1.58 (Ma et al. 2024,
arXiv:2402.17764), stored at 2 bits a weight with group scales.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from trit.errors import TritError

QUANT_METHOD = "trit"
FORMAT_VERSION = 1
LM_HEADS = ("stored", "int8")  # quantization_config.lm_head
PACKED_SUFFIX = "weight_packed"
SCALE_SUFFIX = "weight_scale"
MAX_PLANES = 2
CODES_PER_BYTE = 4
ZERO_BYTE = 0b01010101  # four codes 1: four zero weights
PER_ROW = -1  # group_size of one scale per row
DEFAULT_GROUP_SIZE = 64  # inputs per scale unless told otherwise (2.25 bits a weight with fp16 scales)


class FormatError(TritError, ValueError):
    """A checkpoint, config or tensor that does not follow the trit format.

    ``name`` is the file, tensor or config key at fault; the message says what
    was expected and what was found.
    """

    def __init__(self, name: str, expected: str, found: str):
        self.name, self.expected, self.found = name, expected, found
        super().__init__(f"{name}: expected {expected}, found {found}")


class ScaleDtype(str, enum.Enum):
    """The stored scale dtype; float32 is for imported scales with no exact 16-bit form (BitNet's ``1 / s``)."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"

    @property
    def torch(self) -> torch.dtype:
        return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[self.value]


class ActivationQuant(str, enum.Enum):
    """How activations enter a ternary matmul: as they are, or int8 per token (BitNet's W1.58A8)."""

    NONE = "none"
    INT8_PER_TOKEN = "int8_per_token"


ACTIVATIONS_ENV = "TRIT_ACTIVATIONS"


def served_activation(stored: ActivationQuant, override: str | None = None) -> ActivationQuant:
    """How a load runs the ternary matmuls' activations: ``override`` (an argument of the load), else
    ``TRIT_ACTIVATIONS``, else the checkpoint's ``quantization_config.activation``. ``int8_per_token`` (W1.58A8)
    makes a model of ordinary weights run BitNet's arithmetic, at a quality cost docs/quantization.md measures."""
    choice = override or os.environ.get(ACTIVATIONS_ENV) or stored
    try:
        return ActivationQuant(choice)
    except ValueError:
        where = "activations" if override else ACTIVATIONS_ENV
        raise FormatError(where, f"one of {', '.join(a.value for a in ActivationQuant)}", repr(choice)) from None


class PadPolicy(str, enum.Enum):
    """What the converter does with a layer whose K does not fit the group size."""

    PAD = "pad"  # pad K with zero weights up to a whole group
    KEEP = "keep"  # keep the layer in high precision


@dataclass(frozen=True)
class TritConfig:
    """The ``quantization_config`` of a trit checkpoint."""

    group_size: int = DEFAULT_GROUP_SIZE
    scale_dtype: ScaleDtype = ScaleDtype.FLOAT16
    method: str = "absmean"
    pad_policy: PadPolicy = PadPolicy.PAD
    activation: ActivationQuant = ActivationQuant.NONE
    planes: int = 1  # ternary planes summed per layer (trit-planes)
    # the layers with another count (a bits budget: trit quantize --bits), as sorted (module, planes) pairs; a
    # fused group vLLM loads as one layer (q/k/v, gate/up) shares one count
    layer_planes: tuple[tuple[str, int], ...] = ()
    modules_not_converted: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION
    # the output layer when the model is served: "stored" (as the checkpoint holds it) or "int8" (rounded to int8
    # rows with one scale each when loaded; trit.kernels.int8_rows). Written only when not "stored".
    lm_head: str = "stored"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_group_size(self.group_size, "quantization_config.group_size")
        if self.planes not in range(1, MAX_PLANES + 1) or isinstance(self.planes, bool):
            raise FormatError("quantization_config.planes", f"1 to {MAX_PLANES}", repr(self.planes))
        for module, planes in self.layer_planes:
            if not isinstance(module, str) or planes not in range(1, MAX_PLANES + 1) or isinstance(planes, bool):
                raise FormatError(f"quantization_config.layer_planes[{module!r}]", f"1 to {MAX_PLANES}",
                                  repr(planes))
        object.__setattr__(self, "layer_planes", tuple(sorted(self.layer_planes)))
        if self.format_version != FORMAT_VERSION:
            raise FormatError(
                "quantization_config.format_version", f"{FORMAT_VERSION}", repr(self.format_version)
            )
        if self.lm_head not in LM_HEADS:
            raise FormatError("quantization_config.lm_head", f"one of {', '.join(map(repr, LM_HEADS))}",
                              repr(self.lm_head))

    def padded_k(self, k: int) -> int:
        """K rounded up to what this config stores: a whole number of groups and of bytes."""
        return padded_k(k, self.group_size)

    @property
    def max_planes(self) -> int:
        """The most trit-planes any layer has."""
        return max([self.planes, *(p for _, p in self.layer_planes)])

    def planes_of(self, module: str) -> int:
        """The trit-planes of ``module``: a checkpoint layer, or a fused layer vLLM loads (``qkv_proj``,
        ``gate_up_proj``), whose parts share one count."""
        own = dict(self.layer_planes)
        if module in own:
            return own[module]
        parent, _, leaf = module.rpartition(".")
        counts = {own.get(f"{parent}.{part}", self.planes) for part in FUSED.get(leaf, ())}
        if len(counts) > 1:
            raise FormatError(f"quantization_config.layer_planes: {parent}.{leaf}",
                              "one plane count for the layers vLLM fuses into one", str(sorted(counts)))
        return counts.pop() if counts else self.planes

    def is_converted(self, module: str) -> bool:
        """False for a module listed (or under a prefix listed) in ``modules_not_converted``."""
        return not is_listed(module, self.modules_not_converted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quant_method": QUANT_METHOD,
            "format_version": self.format_version,
            "group_size": self.group_size,
            "scale_dtype": self.scale_dtype.value,
            "method": self.method,
            "pad_policy": self.pad_policy.value,
            "activation": self.activation.value,
            "planes": self.planes,
            **({"layer_planes": dict(self.layer_planes)} if self.layer_planes else {}),
            "modules_not_converted": list(self.modules_not_converted),
            **({"lm_head": self.lm_head} if self.lm_head != "stored" else {}),
            **dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "quantization_config") -> TritConfig:
        """Parse and validate; raises :class:`FormatError` naming the key at fault."""
        if not isinstance(d, Mapping):
            raise FormatError(where, "a JSON object", type(d).__name__)
        if d.get("quant_method") != QUANT_METHOD:
            raise FormatError(f"{where}.quant_method", repr(QUANT_METHOD), repr(d.get("quant_method")))
        if "format_version" not in d:
            raise FormatError(f"{where}.format_version", str(FORMAT_VERSION), "no such key")
        if d["format_version"] != FORMAT_VERSION:
            raise FormatError(
                f"{where}.format_version",
                f"{FORMAT_VERSION} (this trit reads format {FORMAT_VERSION} only)",
                repr(d["format_version"]),
            )
        if "group_size" not in d:
            raise FormatError(f"{where}.group_size", "an integer", "no such key")
        known = {f.name for f in fields(cls)} | {"quant_method"}
        kwargs: dict[str, Any] = {"group_size": d["group_size"], "format_version": d["format_version"]}
        for key, enum_type in (
            ("scale_dtype", ScaleDtype),
            ("pad_policy", PadPolicy),
            ("activation", ActivationQuant),
        ):
            if key in d:
                try:
                    kwargs[key] = enum_type(d[key])
                except ValueError:
                    allowed = ", ".join(repr(e.value) for e in enum_type)
                    raise FormatError(f"{where}.{key}", f"one of {allowed}", repr(d[key])) from None
        if "method" in d:
            kwargs["method"] = str(d["method"])
        if "planes" in d:
            kwargs["planes"] = d["planes"]
        if "lm_head" in d:
            kwargs["lm_head"] = d["lm_head"]
        if "layer_planes" in d:
            layers = d["layer_planes"]
            if not isinstance(layers, Mapping) or not all(isinstance(m, str) for m in layers):
                raise FormatError(f"{where}.layer_planes", "an object of module name: plane count", repr(layers))
            kwargs["layer_planes"] = tuple(layers.items())
        modules = d.get("modules_not_converted", [])
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise FormatError(f"{where}.modules_not_converted", "a list of module names", repr(modules))
        kwargs["modules_not_converted"] = tuple(modules)
        kwargs["extra"] = {k: v for k, v in d.items() if k not in known}
        return cls(**kwargs)


def is_listed(module: str, names: tuple[str, ...] | list[str]) -> bool:
    """Whether ``module`` is one of ``names`` or lies under one (``model.layers.0`` lists its sublayers)."""
    return any(module == m or module.startswith(m + ".") for m in names)


def check_group_size(group_size: Any, where: str) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool):
        raise FormatError(where, "an integer", repr(group_size))
    if group_size != PER_ROW and (group_size < CODES_PER_BYTE or group_size % CODES_PER_BYTE):
        raise FormatError(where, f"{PER_ROW} (one scale per row) or a positive multiple of 4", str(group_size))


def group_width(group_size: int, k_pad: int) -> int:
    """Inputs one scale covers: ``group_size``, or the whole (padded) row for :data:`PER_ROW`."""
    return k_pad if group_size == PER_ROW else group_size


def num_groups(group_size: int, k_pad: int) -> int:
    """Scales a row holds: ``k_pad / group_size``, or 1 for :data:`PER_ROW`."""
    return k_pad // group_width(group_size, k_pad)


def steps_fit_groups(group_size: int, step: int) -> bool:
    """Whether a kernel step of ``step`` inputs never spans two groups (a whole row is one group)."""
    return group_size == PER_ROW or group_size % step == 0


def padded_k(k: int, group_size: int) -> int:
    unit = CODES_PER_BYTE if group_size == PER_ROW else math.lcm(group_size, CODES_PER_BYTE)
    return -(-k // unit) * unit


# ---------------------------------------------------------------------------- packing


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Ternary values ``(N, K)`` in {-1, 0, 1} (any integer dtype) -> ``(N, K // 4)`` uint8.

    K must be a multiple of 4; pad first (:func:`pad_k`) if it is not.
    """
    if codes.dim() != 2 or codes.shape[1] % CODES_PER_BYTE:
        raise FormatError("codes", "a 2-D tensor whose K is a multiple of 4", str(tuple(codes.shape)))
    c = (codes.to(torch.int16) + 1).to(torch.uint8).view(codes.shape[0], -1, CODES_PER_BYTE)
    return c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """``(N, K // 4)`` uint8 -> ``(N, K)`` uint8 raw codes in {0, 1, 2} (3 only in a corrupt file)."""
    shifts = torch.arange(0, 8, 2, device=packed.device, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & 3).reshape(packed.shape[0], -1)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """``(N, K // 4)`` uint8 -> ``(N, K)`` int8 ternary values in {-1, 0, 1}; exact inverse of :func:`pack`."""
    return unpack_codes(packed).to(torch.int8) - 1


def apply_scales(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``values`` ``(..., N, K_pad)`` float times their group's scale ``(..., N, G)``: ``(..., N, K_pad)``.

    The group width is ``K_pad / G`` (a whole row when ``G = 1``); the product is in ``values.dtype``.
    """
    *lead, n, k_pad = values.shape
    groups = scale.shape[-1]
    grouped = values.reshape(*lead, n, groups, k_pad // groups)
    return (grouped * scale.to(values.dtype)[..., None]).reshape(values.shape)


def dequantize(
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G) fp16/bf16/fp32
    in_features: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (N, in_features) dtype
    """The layer's weight ``(c - 1) * scale``, padded columns past ``in_features`` dropped.

    Shifts and masks only (no cached table): safe inside a ``torch.compile`` trace and a backward pass.
    """
    w = apply_scales(unpack(packed).to(dtype), scale)
    return w if in_features is None else w[:, :in_features]


def count_invalid_codes(packed: torch.Tensor) -> int:
    """How many 2-bit fields of ``packed`` hold the value 3 (never valid)."""
    both = packed & (packed >> 1) & 0x55
    return int(sum(((both >> s) & 1).sum().item() for s in range(0, 8, 2)))


def pad_k(weight: torch.Tensor, k_pad: int) -> torch.Tensor:
    """Zero-pad a ``(N, K)`` weight to ``(N, k_pad)``."""
    k = weight.shape[1]
    return weight if k == k_pad else torch.nn.functional.pad(weight, (0, k_pad - k))


def to_scale(scale: torch.Tensor, dtype: ScaleDtype, name: str) -> torch.Tensor:
    """Cast float32 scales to the stored dtype: refuse overflow, lift exact zeros to the smallest step."""
    out = scale.to(dtype.torch)
    if not torch.isfinite(out).all():
        raise FormatError(f"{name}.{SCALE_SUFFIX}", f"scales that fit {dtype.value}", "overflow")
    tiny = torch.finfo(dtype.torch).smallest_normal
    return torch.where(out > 0, out, torch.full_like(out, tiny))


# ---------------------------------------------------------------------------- validation


def expected_shapes(out_features: int, in_features: int, group_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of ``(weight_packed, weight_scale)`` for a layer of this size."""
    k_pad = padded_k(in_features, group_size)
    return (out_features, k_pad // CODES_PER_BYTE), (out_features, num_groups(group_size, k_pad))


def check_layer(
    name: str,
    packed: torch.Tensor,
    scale: torch.Tensor,
    group_size: int,
    out_features: int | None = None,
    in_features: int | None = None,
    check_values: bool = True,
    suffixes: tuple[str, str] = (PACKED_SUFFIX, SCALE_SUFFIX),
) -> None:
    """Refuse a ternary layer (one plane: ``suffixes``) that breaks the format, naming the tensor and the expectation.

    Without ``out_features``/``in_features`` the shapes are checked only against each other.
    """
    p_name, s_name = f"{name}.{suffixes[0]}", f"{name}.{suffixes[1]}"
    if packed.dtype != torch.uint8:
        raise FormatError(p_name, "dtype uint8", str(packed.dtype).removeprefix("torch."))
    if packed.dim() != 2:
        raise FormatError(p_name, "2 dimensions (N, K/4)", f"shape {tuple(packed.shape)}")
    if scale.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise FormatError(s_name, "dtype float16, bfloat16 or float32", str(scale.dtype).removeprefix("torch."))
    n, k4 = packed.shape
    if in_features is None:
        in_features = k4 * CODES_PER_BYTE
    if out_features is None:
        out_features = n
    p_shape, s_shape = expected_shapes(out_features, in_features, group_size)
    if tuple(packed.shape) != p_shape:
        raise FormatError(p_name, f"shape {p_shape} for a {out_features}x{in_features} layer", f"{tuple(packed.shape)}")
    if tuple(scale.shape) != s_shape:
        raise FormatError(s_name, f"shape {s_shape} (group size {group_size})", f"{tuple(scale.shape)}")
    if not check_values:
        return
    bad = count_invalid_codes(packed)
    if bad:
        raise FormatError(p_name, "2-bit codes in {0, 1, 2}", f"{bad} codes equal to 3")
    finite = torch.isfinite(scale)
    if not finite.all():
        raise FormatError(s_name, "finite scales", f"{int((~finite).sum())} NaN or Inf")
    if not (scale > 0).all():
        raise FormatError(s_name, "positive scales", f"{int((scale <= 0).sum())} zero or negative")


def check_padding(name: str, packed: torch.Tensor, in_features: int) -> None:
    """Refuse padded columns (past the true K) that hold anything but zero weights (code 1)."""
    if packed.shape[1] * CODES_PER_BYTE == in_features:
        return
    pad = unpack_codes(packed)[:, in_features:]
    if not (pad == 1).all():
        raise FormatError(name, f"zero weights (code 1) past K={in_features}", f"{int((pad != 1).sum())} other codes")


def check_finite(name: str, t: torch.Tensor) -> None:
    """Refuse a float tensor holding NaN or Inf (a high-precision tensor of a checkpoint: a norm, an embedding)."""
    if t.is_floating_point() and not torch.isfinite(t).all():
        raise FormatError(name, "finite values", f"{int((~torch.isfinite(t)).sum())} NaN or Inf")


# vLLM's fused layers and the checkpoint layers each loads
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def plane_suffixes(planes: int) -> list[tuple[str, str]]:
    """``(packed, scale)`` tensor suffixes of each plane: ``weight_packed``, then ``weight_packed_2``."""
    return [(PACKED_SUFFIX, SCALE_SUFFIX)] + [(f"{PACKED_SUFFIX}_{p + 1}", f"{SCALE_SUFFIX}_{p + 1}")
                                              for p in range(1, planes)]


TERNARY_SUFFIXES = tuple(x for pair in plane_suffixes(MAX_PLANES) for x in pair)


def layer_names(tensor_names: list[str] | set[str]) -> list[str]:
    """The ternary layers a checkpoint holds: every ``X`` with an ``X.weight_packed`` or ``X.weight_scale`` (any plane)."""
    out = set()
    for n in tensor_names:
        module, _, leaf = n.rpartition(".")
        if leaf in TERNARY_SUFFIXES:
            out.add(module)
    return sorted(out)


def bits_per_weight(packed_bytes: int, scale_bytes: int, weights: int) -> float:
    """Storage cost of ternary layers, scales included, over their true (unpadded) weight count."""
    return 8.0 * (packed_bytes + scale_bytes) / max(weights, 1)
