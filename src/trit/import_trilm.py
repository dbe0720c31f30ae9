"""Import float checkpoints whose linear weights are already ternary ({0, +-s}), exactly.

TriLM's ``*_Unpacked`` releases (SpectraSuite) are ordinary fp16 Llama
checkpoints whose every decoder linear weight takes the values ``{0, +s, -s}``,
with ``s`` one per tensor or one per model-parallel shard (so constant along a
row, or along a span of K). Quantizing them again would round a second time;
this import reads the codes and scales as they are:

- a layer's group is the widest span of K over which every row's nonzero
  magnitudes are one value: the row (``group_size = -1``) where that holds
  for every layer, else the widest power of two from 4096 down to 32 that
  holds for every layer (a checkpoint has one group size);
- the scale is that magnitude in the checkpoint's own dtype (exact); an
  all-zero group gets scale 1;
- codes are ``sign(w)``; nothing is re-rounded, so the imported model computes
  the float model's products exactly.

A layer with three or more magnitudes in a group is not ternary: the import
stops naming it and pointing at ``trit quantize``; nothing is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch

from trit import format as fmt
from trit.arch import check_architecture, linear_shapes
from trit.checkpoint import CONFIG_FILE, CheckpointError, check_paths, open_checkpoint, write_checkpoint
from trit.convert import ALWAYS_KEPT, ConvertReport, LayerReport
from trit.errors import ConvertError

GROUPS = (fmt.PER_ROW, 4096, 2048, 1024, 512, 256, 128, 64, 32)  # tried widest first


def _groups_of(w: torch.Tensor, group: int) -> torch.Tensor:
    """``(N, K)`` -> ``(N, K_pad / g, g)`` absolute values, K padded with zeros to a whole group."""
    n, k = w.shape
    g = k if group == fmt.PER_ROW else group
    k_pad = -(-k // g) * g
    return torch.nn.functional.pad(w.abs(), (0, k_pad - k)).reshape(n, k_pad // g, g)


def holds(w: torch.Tensor, group: int) -> bool:
    """Whether every group of ``group`` weights along K has one nonzero magnitude."""
    a = _groups_of(w, group)
    m = a.amax(dim=-1, keepdim=True)
    return bool(((a == m) | (a == 0)).all())


def codes_scales(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` ternary float -> int8 codes ``(N, K)`` and scales ``(N, K_pad / g)`` in ``w``'s dtype."""
    m = _groups_of(w, group).amax(dim=-1)
    return torch.sign(w).to(torch.int8), torch.where(m > 0, m, torch.ones_like(m))


def _magnitudes(w: torch.Tensor) -> str:
    """Where and how a row breaks ternary: its first row with three or more magnitudes."""
    for r in range(w.shape[0]):
        mags = w[r].abs().unique()
        mags = mags[mags > 0]
        if mags.numel() > 1:
            return f"row {r} has {mags.numel()} nonzero magnitudes ({', '.join(f'{float(v):.4g}' for v in mags[:3])}...)"
    return "no row is one magnitude"


def import_trilm(
    model_dir: str | Path,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> ConvertReport:
    """Write the ternary float checkpoint ``model_dir`` as a trit checkpoint at ``out_dir``; see the module docstring."""
    src_dir, out = Path(model_dir), Path(out_dir)
    check_paths(src_dir, out, overwrite)
    ckpt = open_checkpoint(src_dir)
    if ckpt.quantization_config is not None:
        raise CheckpointError(src_dir / CONFIG_FILE, "has a quantization_config; a ternary float checkpoint has none")
    check_architecture(ckpt.config, str(src_dir / CONFIG_FILE))
    sizes = linear_shapes(ckpt.config)
    layers = sorted(sizes)
    if not layers:
        raise ConvertError(f"{src_dir}: no decoder linear layers to import")
    dtypes = {ckpt.tensors[f"{m}.weight"].dtype for m in layers if f"{m}.weight" in ckpt.tensors}
    candidates = list(GROUPS)
    with ExitStack() as stack:
        files = ckpt.open_all(stack)
        for layer in layers:
            name = f"{layer}.weight"
            info = ckpt.tensors.get(name)
            if info is None:
                raise fmt.FormatError(name, "a tensor in the checkpoint", "none")
            w = files[info.shard].get_tensor(name)
            if tuple(w.shape) != sizes[layer] or not w.is_floating_point():
                raise fmt.FormatError(name, f"float weights of shape {sizes[layer]}", f"{w.dtype} {tuple(w.shape)}")
            candidates = [g for g in candidates if holds(w, g)]
            if not candidates:
                raise fmt.FormatError(
                    name, "values {0, +s, -s} with s one per row or per span of at least 32 weights (a ternary "
                    "float checkpoint such as TriLM's)", f"{_magnitudes(w)}; quantize it with trit quantize instead")
    group = candidates[0]
    dtype = next(iter(dtypes)) if len(dtypes) == 1 else "F32"
    scale_dtype = {"F16": fmt.ScaleDtype.FLOAT16, "BF16": fmt.ScaleDtype.BFLOAT16}.get(dtype, fmt.ScaleDtype.FLOAT32)
    report = ConvertReport(out)
    start = time.perf_counter()

    def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        module, leaf = name.rsplit(".", 1)
        if module not in sizes or leaf != "weight":
            return {name: tensor.contiguous()}
        n, k = sizes[module]
        codes, scales = codes_scales(tensor, group)
        packed = fmt.pack(fmt.pad_k(codes, fmt.padded_k(k, group)))
        scales = fmt.to_scale(scales.float(), scale_dtype, module)
        report.packed_bytes += packed.numel()
        report.scale_bytes += scales.numel() * scales.element_size()
        report.ternary_weights += n * k
        report.layers.append(LayerReport(module, (n, k), "ternary"))
        return {f"{module}.{fmt.PACKED_SUFFIX}": packed, f"{module}.{fmt.SCALE_SUFFIX}": scales}

    qcfg = fmt.TritConfig(group_size=group, scale_dtype=scale_dtype, method="ternary-float",
                          modules_not_converted=ALWAYS_KEPT,
                          extra={"source": {"format": "ternary float", "dtype": dtype}})
    what = "one scale a row" if group == fmt.PER_ROW else f"one scale per {group} weights"
    log(f"importing ternary float checkpoint {src_dir} -> {out}: {len(layers)} layers, {what}, exact")
    write_checkpoint(ckpt, out, transform, dict(ckpt.config, quantization_config=qcfg.to_dict()), progress,
                     desc="import")
    report.layers.sort(key=lambda r: r.name)
    report.seconds = time.perf_counter() - start
    return report
