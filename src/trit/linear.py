"""The one ternary layer object: how a loaded layer is held and how its forward runs, the same in the runtime
(:class:`trit.nn.TritLinear`), transformers' ``from_pretrained`` and the vLLM plugin.

The shape of vLLM's ``MPLinearKernel``: a layer's :class:`LinearSpec` (its
sizes, groups, trit-planes, activations) is matched once, at load, against the
layouts in :data:`LAYOUTS`; each says whether it *can* hold the layer
(``can_implement``: ``None`` or the reason) and whether its rule of thumb wants
it (``rule``); the first that can and wants it is chosen. Its
:meth:`LinearKernel.prepare` repacks the layer's plane buffers in place
(``weight_packed``, ``weight_scale``, ``weight_packed_2``, ...), and
:meth:`LinearKernel.apply` is the layer's forward: one custom op a plane
(``trit::linear`` or ``trit::linear_tiled``, the graph boundary vLLM's
``torch.compile`` traces through), which picks a kernel for each M
(:func:`trit.kernels.registry.choose_kernel`).

- :class:`PackedLinear` keeps format v1 as stored (any device; trainable and
  savable): the Triton kernels on CUDA, the CPU kernels, the reference.
- :class:`TiledLinear` repacks into the CUDA kernels' mma layout
  (:mod:`trit.kernels.cuda.mma`). ``TRIT_LAYOUT``: ``auto`` (the default,
  where the CUDA kernels run and the rule wants it), ``v1`` (never), ``mma``
  (wherever the layout can hold the layer, on any device: elsewhere than the
  CUDA kernels run, the plain-PyTorch reference computes it, for tests of the
  layout's path).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

import trit.ops  # registers torch.ops.trit.linear and trit.linear_tiled
from trit import format as fmt
from trit.kernels import tuning
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda import mma

LAYOUT_ENV = "TRIT_LAYOUT"
WARMUP_ENV = "TRIT_WARMUP"
# under "auto", layers of fewer weights than this, or of fewer inputs than TILE_MIN_K, stay in format v1, whose
# Triton kernels were as fast or faster on them (docs/results.md has the runs)
TILE_MIN_WEIGHTS = 20 * 2**20
# W1.58A8 layers of one scale a row on Hopper, which the int8 wgmma kernel takes from this size, or from
# TILE_MIN_WEIGHTS_A8_WIDE where they have TILE_MIN_N_A8 outputs or more and TILE_MIN_K inputs; layers of groups
# keep TILE_MIN_WEIGHTS, format v1 having run them faster at every M below it (docs/kernels.md)
TILE_MIN_WEIGHTS_A8 = 16 * 2**20
TILE_MIN_WEIGHTS_A8_WIDE = 8 * 2**20
TILE_MIN_N_A8 = 3072
TILE_MIN_K = 2048
# the token counts a layer's forward runs at warm-up: the decode GEMV's unrolled M (1-4), each M bucket of the
# tuned tables (powers of two) once divisible by 16 and once not (Triton compiles both), the dequantize path
WARM_UP_MS = (1, 2, 3, 4, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1024)


@dataclass(frozen=True)
class LinearSpec:
    """What a ternary layer is: ``(N, K)`` weights in groups of ``group_size``, ``planes`` trit-planes summed, and
    whether its activations are rounded to int8 per token (W1.58A8)."""

    out_features: int
    in_features: int
    group_size: int
    planes: int = 1
    act_int8: bool = False


def _layout_wanted() -> str:
    wanted = os.environ.get(LAYOUT_ENV, "auto") or "auto"
    if wanted not in ("auto", "mma", "v1"):
        raise ValueError(f"{LAYOUT_ENV}={wanted!r}: expected 'auto', 'mma' or 'v1'")
    return wanted


def _put(layer: nn.Module, name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    """Hold ``tensor`` as ``layer.<name>``, of the kind ``like`` was (a vLLM parameter, or a runtime buffer)."""
    if isinstance(like, nn.Parameter):
        layer.register_parameter(name, nn.Parameter(tensor, requires_grad=False))
    else:
        layer.register_buffer(name, tensor, persistent=False)


class LinearKernel:
    """A layout a ternary layer can be held in, bound to one layer's :class:`LinearSpec`."""

    name: ClassVar[str]

    def __init__(self, spec: LinearSpec):
        self.spec = spec

    @classmethod
    def can_implement(cls, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        """``None`` if this layout can hold the layer for activations of ``dtype`` on ``device``, else why not."""
        raise NotImplementedError

    @classmethod
    def rule(cls, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        """``None`` if the rule of thumb holds the layer in this layout, else why not."""
        return None

    def prepare(self, layer: nn.Module) -> None:
        """Repack the layer's plane buffers, loaded in format v1, into this layout, in place."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def warm_up(self, layer: nn.Module, dtype: torch.dtype, ms: tuple[int, ...] = WARM_UP_MS) -> int:
        """Run the forward once at each M of ``ms`` on zeros, once a process per layer shape, so that the kernels
        it will choose compile (or load from the disk caches) now, at load, instead of in the first requests.
        Returns the calls made (0 for a shape already warmed)."""
        device = self.device(layer)
        fresh: list[bool] = []
        tuning.memo(("warm", self.name, self.spec, device, dtype, ms), lambda: fresh.append(True))
        if not fresh:
            return 0
        with torch.inference_mode():
            for m in ms:
                self.apply(layer, torch.zeros(m, self.spec.in_features, dtype=dtype, device=device))
        return len(ms)

    def device(self, layer: nn.Module) -> torch.device:
        raise NotImplementedError


class PackedLinear(LinearKernel):
    """Format v1 as stored: ``weight_packed`` (N, K_pad // 4) uint8 and ``weight_scale`` (N, G), a pair a plane."""

    name = "v1"

    @classmethod
    def can_implement(cls, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        return None

    def planes(self, layer: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(getattr(layer, p), getattr(layer, s)) for p, s in fmt.plane_suffixes(self.spec.planes)]

    def device(self, layer: nn.Module) -> torch.device:
        return getattr(layer, fmt.PACKED_SUFFIX).device

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        s = self.spec
        y = None
        for packed, scale in self.planes(layer):
            out = trit.ops.linear(x, packed, scale, s.group_size, bias if y is None else None, s.act_int8)
            y = out if y is None else y + out
        return y


class TiledLinear(LinearKernel):
    """The CUDA kernels' mma layout (:mod:`trit.kernels.cuda.mma`), made at load: ``tiles_{i}_codes`` and
    ``tiles_{i}_scales`` a plane, in place of the format-v1 buffers."""

    name = "mma"

    @classmethod
    def can_implement(cls, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        wanted = _layout_wanted()
        if wanted == "v1":
            return f"{LAYOUT_ENV}=v1"
        if wanted == "mma":  # wherever the layout holds the layer (the reference computes it off CUDA)
            if spec.group_size not in mma.GROUPS:
                return f"group size {spec.group_size}: the mma layout takes {mma.GROUPS}"
            return None if spec.in_features % 8 == 0 else f"K = {spec.in_features} is not a multiple of 8"
        return cuda_launch.layout_refusal(device, dtype, spec.group_size, spec.in_features)

    @classmethod
    def rule(cls, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        if _layout_wanted() == "mma":
            return None
        weights = spec.out_features * spec.in_features
        wide = (weights >= TILE_MIN_WEIGHTS_A8_WIDE and spec.out_features >= TILE_MIN_N_A8
                and spec.in_features >= TILE_MIN_K)
        if spec.act_int8 and spec.group_size == fmt.PER_ROW and (weights >= TILE_MIN_WEIGHTS_A8 or wide) \
                and cuda_launch.int8_wgmma_refusal(device, spec.group_size) is None:
            return None  # W1.58A8 of one scale a row: the int8 wgmma kernel, which reads this layout only
        if weights < TILE_MIN_WEIGHTS:
            return (f"{spec.out_features} x {spec.in_features} weights: below {TILE_MIN_WEIGHTS // 2**20}Mi, format "
                    "v1's Triton kernels are as fast or faster")
        if spec.in_features < TILE_MIN_K:
            return f"K = {spec.in_features} < {TILE_MIN_K}: format v1's Triton kernels are faster there"
        return None

    def prepare(self, layer: nn.Module) -> None:
        for i, (packed_name, scale_name) in enumerate(fmt.plane_suffixes(self.spec.planes)):
            packed, scale = getattr(layer, packed_name), getattr(layer, scale_name)
            r = mma.repack(packed.data, scale.data, self.spec.group_size, self.spec.in_features)
            delattr(layer, packed_name)  # the repacked layer replaces the loaded one: one copy of the weights
            delattr(layer, scale_name)
            _put(layer, f"tiles_{i}_codes", r.wq, packed)
            _put(layer, f"tiles_{i}_scales", r.sc, scale)

    def tiles(self, layer: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each plane's ``(wq (NT, KS, 32, 4) int32, sc (NT, GP, 8) int32)``."""
        return [(getattr(layer, f"tiles_{i}_codes"), getattr(layer, f"tiles_{i}_scales"))
                for i in range(self.spec.planes)]

    def device(self, layer: nn.Module) -> torch.device:
        return layer.tiles_0_codes.device

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        s = self.spec
        y = None
        for wq, sc in self.tiles(layer):
            out = trit.ops.linear_tiled(x, wq, sc, s.out_features, s.group_size, bias if y is None else None,
                                        s.act_int8)
            y = out if y is None else y + out
        return y


LAYOUTS: tuple[type[LinearKernel], ...] = (TiledLinear, PackedLinear)  # tried in this order; format v1 always can


@dataclass(frozen=True)
class LayoutChoice:
    kernel: type[LinearKernel]
    refused: tuple[tuple[str, str], ...]  # (layout, why not) for each layout passed over

    def explain(self) -> str:
        return "\n".join([*(f"{name}: {why}" for name, why in self.refused), f"{self.kernel.name}: chosen"])


def choose(spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> LayoutChoice:
    """The first layout of :data:`LAYOUTS` that can hold the layer and whose rule wants it."""
    refused = []
    for kernel in LAYOUTS:
        why = kernel.can_implement(spec, device, dtype)
        why = f"cannot: {why}" if why is not None else kernel.rule(spec, device, dtype)
        if why is None:
            return LayoutChoice(kernel, tuple(refused))
        refused.append((kernel.name, why))
    raise AssertionError("format v1 refused a layer")  # unreachable: it always can


def prepare(layer: nn.Module, spec: LinearSpec, device: torch.device, dtype: torch.dtype) -> LayoutChoice:
    """Choose the layer's layout, repack it in place, and bind its forward (``layer.trit_kernel``)."""
    choice = choose(spec, device, dtype)
    kernel = choice.kernel(spec)
    kernel.prepare(layer)
    layer.trit_kernel = kernel
    return choice


def warm_up_wanted(device: torch.device) -> bool:
    """``TRIT_WARMUP``: ``1`` always, ``0`` never, unset: on CUDA (where kernels compile)."""
    flag = os.environ.get(WARMUP_ENV, "")
    return flag == "1" or (flag != "0" and device.type == "cuda")


def round_activations_int8(x: torch.Tensor, amax: torch.Tensor | None = None) -> torch.Tensor:
    """W1.58A8's activation rounding as ``x_q / s`` in ``x.dtype``, each token's scale from ``amax`` (its
    ``max |x|``, shape ``(..., 1)``) where the caller holds only part of the row (a tensor-parallel shard)."""
    from trit.kernels.reference import fake_quantize_activations_int8

    return fake_quantize_activations_int8(x, amax)
