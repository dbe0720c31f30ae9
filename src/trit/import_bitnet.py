"""Import natively ternary checkpoints in transformers' ``bitnet`` format into trit format 1.

Models trained ternary (BitNet b1.58 2B4T, Falcon3-*-1.58bit, Llama3-8B-1.58)
ship with ``quantization_config.quant_method = "bitnet"``. The arithmetic,
read from transformers' ``integrations/bitnet.py``:

- codes ``w + 1`` in {0, 1, 2}, packed four to a uint8 along the OUTPUT
  dimension in quarter blocks: a ``(N, K)`` layer is stored as
  ``weight`` ``(ceil(N / 4), K)``, output row ``r + i * ceil(N / 4)`` in bits
  ``2i`` of byte row ``r``;
- one scale per tensor, ``weight_scale`` of one element, whose meaning depends
  on ``linear_class``:

  - ``"bitlinear"`` (the default): ``y = (x_q @ w.T) / (s_x * weight_scale)``,
    so the weight scale is ``1 / weight_scale``;
  - ``"autobitlinear"`` with ``quantization_mode = "offline"``:
    ``y = (x_q / s_x) @ w.T * weight_scale``, so the scale is ``weight_scale``;
  - ``"autobitlinear"`` with ``quantization_mode = "online"``: float master
    weights, quantized per tensor at run time as ``s = 1 / mean|W|``
    (``mean|W|`` floored at 1e-5), ``w = clamp(round(W * s), -1, 1)``; here
    the same rule runs once, at import, and the scale is ``1 / s``;

- activations quantized to int8 per token by their absolute maximum
  (``s_x = 127 / max|x|``) in every case: the imported checkpoint records
  ``activation = "int8_per_token"`` and trit's op does the same.

The import repacks the codes along K (trit's layout), stores the tensor scale
once per row (``group_size = -1``), and writes through the atomic
:func:`trit.checkpoint.write_checkpoint`: a bad code (the fourth value, 3), a missing or non-positive scale or
a layer of the wrong shape stops it with the tensor named and nothing written.
BitNet b1.58: Ma et al. 2024, arXiv:2402.17764.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from trit import format as fmt
from trit.arch import is_decoder_linear, meta_model
from trit.checkpoint import (
    CONFIG_FILE,
    Checkpoint,
    CheckpointError,
    check_paths,
    open_checkpoint,
    write_checkpoint,
)
from trit.convert import ALWAYS_KEPT, ConvertReport, LayerReport
from trit.errors import ConvertError

SOURCE_METHOD = "bitnet"
MODEL_TYPES = ("bitnet", "llama")  # BitNet b1.58 2B4T; Falcon3-1.58bit and Llama3-8B-1.58 are Llama
VALUES_PER_BYTE = 4
MIN_MEAN_ABS = 1e-5  # transformers' WeightQuant floor


@dataclass(frozen=True)
class Source:
    """What a BitNet ``quantization_config`` says about its layers."""

    linear_class: str  # "bitlinear" | "autobitlinear"
    mode: str  # "offline" | "online"
    not_converted: tuple[str, ...]

    @property
    def packed(self) -> bool:
        return self.mode == "offline"

    @property
    def inverse_scale(self) -> bool:
        return self.linear_class == "bitlinear"

    @classmethod
    def of(cls, ckpt: Checkpoint) -> Source:
        where = ckpt.path / CONFIG_FILE
        q = ckpt.quantization_config
        if not isinstance(q, dict) or q.get("quant_method") != SOURCE_METHOD:
            found = "none" if q is None else repr(q.get("quant_method") if isinstance(q, dict) else q)
            raise CheckpointError(where, f"expected quantization_config.quant_method 'bitnet', found {found}")
        if ckpt.config.get("model_type") not in MODEL_TYPES:
            raise CheckpointError(
                where, f"model_type {ckpt.config.get('model_type')!r}: BitNet import supports {', '.join(MODEL_TYPES)}"
            )
        linear_class = q.get("linear_class", "bitlinear")
        mode = q.get("quantization_mode", "offline")
        if linear_class not in ("bitlinear", "autobitlinear"):
            raise CheckpointError(where, f"quantization_config.linear_class {linear_class!r} is not a BitNet class")
        if mode not in ("offline", "online"):
            raise CheckpointError(where, f"quantization_config.quantization_mode {mode!r}: expected offline or online")
        if linear_class == "bitlinear" and mode == "online":
            raise CheckpointError(where, "linear_class 'bitlinear' has no online mode (transformers packs it offline)")
        if q.get("use_rms_norm"):
            raise CheckpointError(
                where, "use_rms_norm = true (a norm inside every BitLinear) is not supported by the import"
            )
        return cls(linear_class, mode, tuple(q.get("modules_to_not_convert") or ()))

    def converts(self, module: str) -> bool:
        return not fmt.is_listed(module, self.not_converted)


def unpack_output_dim(packed: torch.Tensor, n: int) -> torch.Tensor:
    """BitNet's ``(ceil(N / 4), K)`` uint8 -> codes ``(N, K)`` uint8 in {0..3} (no -1 applied)."""
    blocks = [(packed >> (2 * i)) & 3 for i in range(VALUES_PER_BYTE)]  # 4 x (ceil(N / 4), K)
    return torch.cat(blocks, dim=0)[:n]  # output row r + i * rows sits in block i, row r


def _layer_sizes(ckpt: Checkpoint) -> dict[str, tuple[int, int]]:
    """``(out_features, in_features)`` of every decoder linear layer, from the model built on meta."""
    from torch import nn

    model = meta_model(ckpt)
    return {
        name: (m.out_features, m.in_features)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and is_decoder_linear(name)
    }


def _read_scales(ckpt: Checkpoint, layers: list[str]) -> dict[str, float]:
    """Each converted layer's one-element ``weight_scale`` as a float, checked finite and positive."""
    scales: dict[str, float] = {}
    with ExitStack() as stack:
        files = ckpt.open_all(stack)
        for layer in layers:
            name = f"{layer}.{fmt.SCALE_SUFFIX}"
            info = ckpt.tensors.get(name)
            if info is None:
                raise fmt.FormatError(name, "a one-element BitNet weight scale", "no such tensor")
            t = files[info.shard].get_tensor(name)
            if t.numel() != 1 or not t.is_floating_point():
                raise fmt.FormatError(name, "one float scale per tensor", f"{t.dtype} of shape {tuple(t.shape)}")
            value = float(t.float())
            if not (value > 0 and value != float("inf")):
                raise fmt.FormatError(name, "a finite positive scale", repr(value))
            scales[layer] = value
    return scales


def _scale_dtype(ckpt: Checkpoint, src: Source, layers: list[str]) -> fmt.ScaleDtype:
    """The source's own 16-bit dtype when its scales are used as they are (exact); else float32.

    An inverse (``bitlinear``) or computed (online) scale has no exact 16-bit
    form, and one rounding of it (2^-11 in fp16) moves ``x * s_x`` across
    int8 rounding boundaries often enough to be seen in the logits.
    """
    if src.packed and not src.inverse_scale:
        dtypes = {ckpt.tensors[f"{layer}.{fmt.SCALE_SUFFIX}"].dtype for layer in layers}
        if dtypes == {"BF16"}:
            return fmt.ScaleDtype.BFLOAT16
        if dtypes == {"F16"}:
            return fmt.ScaleDtype.FLOAT16
    return fmt.ScaleDtype.FLOAT32


def _ternary_values(name: str, weight: torch.Tensor, src: Source, n: int, k: int) -> tuple[torch.Tensor, float | None]:
    """``(N, K)`` int8 in {-1, 0, 1}, and for online weights the scale found here."""
    if src.packed:
        rows = -(-n // VALUES_PER_BYTE)
        if weight.dtype != torch.uint8 or tuple(weight.shape) != (rows, k):
            raise fmt.FormatError(
                name, f"uint8 codes of shape ({rows}, {k}) (4 per byte along the output dimension)",
                f"{weight.dtype} of shape {tuple(weight.shape)}",
            )
        codes = unpack_output_dim(weight, n)
        bad = codes == 3
        if bad.any():
            r, c = (int(i) for i in bad.nonzero()[0])
            raise fmt.FormatError(
                name, "codes in {0, 1, 2} (ternary)", f"{int(bad.sum())} codes of value 3, the first at row {r}, column {c}"
            )
        return codes.to(torch.int8) - 1, None
    if not weight.is_floating_point() or tuple(weight.shape) != (n, k):
        raise fmt.FormatError(name, f"float master weights of shape ({n}, {k})", f"{weight.dtype} {tuple(weight.shape)}")
    w = weight.float()
    s = 1.0 / w.abs().mean().clamp(min=MIN_MEAN_ABS)
    return (w * s).round().clamp(-1, 1).to(torch.int8), float(1.0 / s)


def import_bitnet(
    model_dir: str | Path,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> ConvertReport:
    """Write the BitNet checkpoint ``model_dir`` as a trit checkpoint at ``out_dir``; see the module docstring."""
    src_dir, out = Path(model_dir), Path(out_dir)
    check_paths(src_dir, out, overwrite)
    ckpt = open_checkpoint(src_dir)
    src = Source.of(ckpt)
    sizes = _layer_sizes(ckpt)
    layers = sorted(m for m in sizes if src.converts(m))
    if not layers:
        raise ConvertError(f"{src_dir}: every linear layer is in modules_to_not_convert; nothing to import")
    for layer in layers:
        if f"{layer}.weight" not in ckpt.tensors:
            raise fmt.FormatError(f"{layer}.weight", "a tensor in the checkpoint", "none")
    converted = set(layers)
    scales = _read_scales(ckpt, layers) if src.packed else {}
    scale_dtype = _scale_dtype(ckpt, src, layers)
    report = ConvertReport(out)
    start = time.perf_counter()

    def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        module, leaf = name.rsplit(".", 1)
        if module not in converted or leaf not in ("weight", fmt.SCALE_SUFFIX):
            return {name: tensor.contiguous()}
        if leaf == fmt.SCALE_SUFFIX:
            return {}  # the per-tensor scale goes into the row scales written with the codes
        n, k = sizes[module]
        values, found = _ternary_values(name, tensor, src, n, k)
        scale = found if found is not None else (1.0 / scales[module] if src.inverse_scale else scales[module])
        packed = fmt.pack(fmt.pad_k(values, fmt.padded_k(k, fmt.PER_ROW)))  # (N, K_pad // 4) uint8
        row_scales = fmt.to_scale(torch.full((n, 1), scale), scale_dtype, module)  # (N, 1)
        report.packed_bytes += packed.numel()
        report.scale_bytes += row_scales.numel() * row_scales.element_size()
        report.ternary_weights += n * k
        report.layers.append(LayerReport(module, (n, k), "ternary"))
        return {f"{module}.{fmt.PACKED_SUFFIX}": packed, f"{module}.{fmt.SCALE_SUFFIX}": row_scales}

    kept = tuple(sorted(m for m in sizes if m not in layers))
    qcfg = fmt.TritConfig(
        group_size=fmt.PER_ROW, scale_dtype=scale_dtype, method="bitnet", activation=fmt.ActivationQuant.INT8_PER_TOKEN,
        modules_not_converted=ALWAYS_KEPT + kept,
        extra={"source": {"quant_method": SOURCE_METHOD, "linear_class": src.linear_class, "quantization_mode": src.mode}},
    )
    log(f"importing BitNet checkpoint {src_dir} -> {out}: {src.linear_class}, {src.mode}, {len(layers)} layers")
    config = dict(ckpt.config, quantization_config=qcfg.to_dict())
    write_checkpoint(ckpt, out, transform, config, progress, desc="import")
    report.layers += [LayerReport(m, sizes[m], "kept", "modules_to_not_convert") for m in kept]
    report.layers.sort(key=lambda r: r.name)
    report.seconds = time.perf_counter() - start
    return report
