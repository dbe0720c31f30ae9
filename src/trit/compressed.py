"""The W4A8 recipe's file format: compressed-tensors, as stock vLLM reads it.

W4A8 here is int4 weights (symmetric, static scales, one per group of
``group_size`` inputs or one per output channel) with int8 activations
(symmetric, dynamic, one scale per token). The checkpoint is what
llm-compressor writes with ``save_compressed=True`` for that scheme: format
``int-quantized``, each linear layer's ``weight`` the int4 codes stored one per
``int8``, ``weight_scale`` ``(N, K // group)`` (``(N, 1)`` channel-wise) in the
model's dtype, ``lm_head`` ignored; the weight is ``weight * weight_scale``
repeated over each group. vLLM's scheme check (``_is_dynamic_token_w4a8_int``)
takes exactly this: weights 4-bit int symmetric, GROUP or CHANNEL, static;
activations 8-bit int, TOKEN, dynamic.

This module builds and parses that ``quantization_config`` and checks that a
group size fits every layer, before any work is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trit.errors import TritError

QUANT_METHOD = "compressed-tensors"
FORMAT = "int-quantized"
CHANNEL = -1  # one scale per output channel (strategy "channel")
BITS = 4  # the weights' int4 codes
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")  # their K is split across tensor-parallel ranks
GROUP_CHOICES = (32, 64, 128, 256)


class W4A8ConfigError(TritError, ValueError):
    """A ``quantization_config`` that is not the W4A8 int scheme, or a group size that does not fit."""


@dataclass(frozen=True)
class W4A8Scheme:
    group_size: int = 64  # CHANNEL (-1): one scale per output channel
    ignore: tuple[str, ...] = ("lm_head",)

    def groups(self, k: int) -> int:
        """Scales a row of ``k`` inputs holds: one channel-wise, else ``k / group_size``."""
        return 1 if self.group_size == CHANNEL else k // self.group_size

    @property
    def strategy(self) -> str:
        return "channel" if self.group_size == CHANNEL else "group"

    def to_dict(self) -> dict[str, Any]:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": self.strategy,
                   "group_size": None if self.group_size == CHANNEL else self.group_size, "dynamic": False,
                   "actorder": None, "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
        activations = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "group_size": None,
                       "dynamic": True, "actorder": None, "block_structure": None, "observer": None,
                       "observer_kwargs": {}}
        return {"quant_method": QUANT_METHOD, "format": FORMAT, "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": activations, "output_activations": None,
                                              "format": FORMAT}},
                "ignore": list(self.ignore), "kv_cache_scheme": None, "sparsity_config": {},
                "global_compression_ratio": None, "producer": {"name": "trit"}}

    @classmethod
    def from_dict(cls, q: Mapping[str, Any], where: str) -> W4A8Scheme:
        """The scheme of a W4A8 int ``quantization_config``; anything else is refused, naming what differs."""
        def refuse(what: str) -> W4A8ConfigError:
            return W4A8ConfigError(f"{where}: {what}; trit reads the W4A8 int scheme only (int4 symmetric static "
                                   "weights by group or channel, int8 dynamic per-token activations)")

        if q.get("quant_method") != QUANT_METHOD:
            raise refuse(f"quant_method {q.get('quant_method')!r}, expected {QUANT_METHOD!r}")
        if q.get("format") not in (FORMAT, None):
            raise refuse(f"format {q.get('format')!r}, expected {FORMAT!r}")
        groups = q.get("config_groups") or {}
        if len(groups) != 1:
            raise refuse(f"{len(groups)} config_groups, expected one")
        (group,) = groups.values()
        w, a = group.get("weights") or {}, group.get("input_activations") or {}
        wants = [("weights", w, "num_bits", 4), ("weights", w, "type", "int"), ("weights", w, "symmetric", True),
                 ("weights", w, "dynamic", False), ("input_activations", a, "num_bits", 8),
                 ("input_activations", a, "type", "int"), ("input_activations", a, "symmetric", True),
                 ("input_activations", a, "strategy", "token"), ("input_activations", a, "dynamic", True)]
        for part, d, key, want in wants:
            if d.get(key) != want:
                raise refuse(f"{part}.{key} is {d.get(key)!r}, expected {want!r}")
        if w.get("strategy") == "channel":
            size = CHANNEL
        elif w.get("strategy") == "group" and isinstance(w.get("group_size"), int) and w["group_size"] > 0:
            size = w["group_size"]
        else:
            raise refuse(f"weights.strategy {w.get('strategy')!r} with group_size {w.get('group_size')!r}")
        return cls(size, tuple(q.get("ignore") or ()))


def is_w4a8(q: Mapping[str, Any] | None) -> bool:
    return bool(q) and q.get("quant_method") == QUANT_METHOD


def parse_group_size(text: str) -> int:
    """``--group-size`` for W4A8: a positive integer or ``channel``."""
    if text == "channel":
        return CHANNEL
    try:
        size = int(text)
    except ValueError:
        raise W4A8ConfigError(f"--group-size {text!r}: expected a positive integer or 'channel'") from None
    if size <= 0:
        raise W4A8ConfigError(f"--group-size {size}: expected a positive integer or 'channel'")
    return size


def check_group_size(shapes: Mapping[str, tuple[int, int]], group_size: int, tensor_parallel: int = 1) -> None:
    """Refuse, naming the layers, a group size that does not divide a layer's input (per tensor-parallel rank
    for the row-parallel layers, whose input is split), and say which sizes fit every layer.

    ``shapes``: ``{module: (N, K)}`` of the layers to be quantized.
    """
    if tensor_parallel < 1:
        raise W4A8ConfigError(f"--tensor-parallel-size {tensor_parallel}: expected at least 1")

    def bad_layers(size: int) -> list[str]:
        out = []
        for name, (n, k) in shapes.items():
            row_parallel = name.endswith(ROW_PARALLEL)
            if row_parallel and k % tensor_parallel:
                out.append(f"{name} (K={k} does not split over {tensor_parallel} ranks)")
            elif size != CHANNEL and (k // tensor_parallel if row_parallel else k) % size:
                part = f"K={k}" + (f", {k // tensor_parallel} a rank" if row_parallel and tensor_parallel > 1 else "")
                out.append(f"{name} ({part})")
            elif n % tensor_parallel and not row_parallel:
                out.append(f"{name} (N={n} does not split over {tensor_parallel} ranks)")
        return out

    bad = bad_layers(group_size)
    if not bad:
        return
    fits = [str(g) for g in GROUP_CHOICES if not bad_layers(g)]
    fits += ["channel"] if not bad_layers(CHANNEL) else []
    shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    what = "channel-wise scales" if group_size == CHANNEL else f"group size {group_size}"
    tp = f" with --tensor-parallel-size {tensor_parallel}" if tensor_parallel > 1 else ""
    hint = f"sizes that fit every layer: {', '.join(fits)}" if fits else "no group size fits every layer"
    raise W4A8ConfigError(f"{what}{tp} does not fit {len(bad)} of {len(shapes)} layers: {shown}; {hint}")


__all__ = ["W4A8Scheme", "W4A8ConfigError", "CHANNEL", "QUANT_METHOD", "check_group_size", "is_w4a8",
           "parse_group_size"]
