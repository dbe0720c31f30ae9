"""The converter: a float Hugging Face checkpoint in, a trit checkpoint (format 1) out.

Reads the source lazily, shard by shard and tensor by tensor (memory-mapped
safetensors), quantizes the decoder's linear layers with a method from
:mod:`trit.quant` and writes one output shard per input shard, so peak memory
is about one output shard plus one layer. The writing is
:func:`trit.checkpoint.write_checkpoint`'s: atomic, so an error or Ctrl-C
leaves nothing behind, and the source is never written to.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trit import format as fmt
from trit.arch import check_float_source, is_decoder_linear, open_float_source
from trit.calibrate import CalibOptions
from trit.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_all_finite,
    write_checkpoint,
)
from trit.errors import ConvertError
from trit.quant import Method, quantize
from trit.quant.gptq import GptqOptions
from trit.quant.planes import quantize_planes
from trit.quant.rotate import rotated_config
from trit.rotation import ROTATION_SEED, choose_rotation, rotation_maps, tied_head_bytes

ALWAYS_KEPT = ("model.embed_tokens", "lm_head")


@dataclass(frozen=True)
class ConvertOptions:
    method: Method = Method.GPTQ  # calibrated: data-free unless calib names a text
    group_size: int = fmt.DEFAULT_GROUP_SIZE
    keep: tuple[str, ...] = ()  # module names or glob patterns kept in high precision
    pad_policy: fmt.PadPolicy = fmt.PadPolicy.PAD
    scale_dtype: fmt.ScaleDtype = fmt.ScaleDtype.FLOAT16
    overwrite: bool = False
    device: str = "cpu"  # where the quantizer runs
    planes: int = 1  # ternary planes per layer (2: trit-planes, about 4 bits a weight)
    lm_head: str = "stored"  # the output layer when served: as stored, or "int8" rows (rounded when loaded)
    calib: CalibOptions = CalibOptions()  # gptq: calibration data
    # gptq: the settings of :class:`trit.quant.gptq.GptqOptions`, whose defaults are the ones stated
    act_order: bool = GptqOptions.act_order
    damp: float = GptqOptions.damp
    passes: int = GptqOptions.passes
    float_target: bool | None = GptqOptions.float_target
    # rotate the residual stream (and each value head) before quantizing: the same function, incoherent weights
    # (trit.quant.rotate); a tied lm_head becomes the model's own. None: for gptq (measured better there across
    # domains, one plane and two: docs/quantization.md), not for the data-free rules
    rotate: bool | None = None

    @property
    def rotates(self) -> bool:
        return self.rotate if self.rotate is not None else Method(self.method) is Method.GPTQ

    def gptq(self) -> GptqOptions:
        return GptqOptions(self.group_size, self.planes, self.damp, self.act_order, passes=self.passes,
                           float_target=self.float_target)


@dataclass(frozen=True)
class LayerReport:
    name: str
    shape: tuple[int, int]  # (N, K) of the float weight
    action: str  # "ternary", "padded" or "kept"
    reason: str = ""


@dataclass
class ConvertReport:
    out_dir: Path
    layers: list[LayerReport] = field(default_factory=list)
    packed_bytes: int = 0
    scale_bytes: int = 0
    ternary_weights: int = 0
    seconds: float = 0.0

    @property
    def bits_per_weight(self) -> float:
        return fmt.bits_per_weight(self.packed_bytes, self.scale_bytes, self.ternary_weights)

    def summary(self) -> str:
        counts = {a: sum(1 for layer in self.layers if layer.action == a) for a in ("ternary", "padded", "kept")}
        lines = [
            f"wrote {self.out_dir} in {self.seconds:.1f} s",
            f"  ternary layers: {counts['ternary'] + counts['padded']} "
            f"({counts['padded']} padded along K), kept in high precision: {counts['kept']}",
            f"  ternary weights: {self.ternary_weights:,}, stored in "
            f"{(self.packed_bytes + self.scale_bytes) / 2**20:.1f} MiB: "
            f"{self.bits_per_weight:.3f} bits per weight including scales",
        ]
        for layer in self.layers:
            if layer.action != "ternary":
                lines.append(f"  {layer.action:>6}  {layer.name} {layer.shape[0]}x{layer.shape[1]}: {layer.reason}")
        return "\n".join(lines)


def _plan(ckpt: Checkpoint, opts: ConvertOptions) -> dict[str, LayerReport]:
    """Decide, before reading any data, what happens to each decoder linear layer."""
    modules = {name.rsplit(".", 1)[0] for name in ckpt.tensors}
    unmatched = [p for p in opts.keep if not any(fnmatch.fnmatchcase(m, p) for m in modules)]
    if unmatched:
        raise ConvertError(f"--keep {', '.join(unmatched)}: matches no module of {ckpt.path}")
    plan: dict[str, LayerReport] = {}
    for name, info in ckpt.tensors.items():
        module, leaf = name.rsplit(".", 1)
        if leaf != "weight" or not is_decoder_linear(module):
            continue
        if len(info.shape) != 2:
            raise CheckpointError(info.shard, f"tensor {name!r}: expected a 2-D linear weight, found shape {info.shape}")
        n, k = info.shape
        if any(fnmatch.fnmatchcase(module, p) for p in opts.keep):
            plan[module] = LayerReport(module, (n, k), "kept", "--keep")
        elif k != fmt.padded_k(k, opts.group_size):
            if opts.pad_policy is fmt.PadPolicy.KEEP:
                why = f"K={k} is not a multiple of group {opts.group_size}; --pad keep"
                plan[module] = LayerReport(module, (n, k), "kept", why)
            else:
                why = f"K={k} padded to {fmt.padded_k(k, opts.group_size)} with zero weights"
                plan[module] = LayerReport(module, (n, k), "padded", why)
        else:
            plan[module] = LayerReport(module, (n, k), "ternary")
    if not any(r.action != "kept" for r in plan.values()):
        raise ConvertError(f"{ckpt.path}: no linear layer left to quantize")
    return plan


def _quantize_layer(
    module: str, weight: torch.Tensor, opts: ConvertOptions, report: ConvertReport,
    precomputed: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    n, k = weight.shape
    k_pad = fmt.padded_k(k, opts.group_size)
    if module in precomputed:  # calibrated (GPTQ): codes (P, N, K_pad), scales (P, N, G)
        codes, scales = precomputed.pop(module)
        planes = [(codes[p], scales[p]) for p in range(codes.shape[0])]
    else:
        w = fmt.pad_k(weight.to(opts.device, torch.float32), k_pad)
        fits = quantize_planes(w, opts.group_size) if opts.planes == 2 else [quantize(w, opts.group_size, opts.method)]
        planes = [(t.values, t.scales) for t in fits]
    out = {}
    for (packed_name, scale_name), (values, scales) in zip(fmt.plane_suffixes(len(planes)), planes):
        packed = fmt.pack(values).cpu()  # (N, K_pad//4) uint8
        scale = fmt.to_scale(scales, opts.scale_dtype, module).cpu()  # (N, G)
        report.packed_bytes += packed.numel()
        report.scale_bytes += scale.numel() * scale.element_size()
        out |= {f"{module}.{packed_name}": packed, f"{module}.{scale_name}": scale}
    report.ternary_weights += n * k
    return out


def _output_bytes(ckpt: Checkpoint, plan: dict[str, LayerReport], opts: ConvertOptions) -> int:
    """About how large the output is: ternary layers at their packed size, everything else as it is."""
    total = 0
    for name, info in ckpt.tensors.items():
        layer = plan.get(name.rsplit(".", 1)[0])
        if layer is not None and layer.action != "kept" and name.endswith(".weight"):
            (p_shape, s_shape) = fmt.expected_shapes(*layer.shape, opts.group_size)
            scale_bytes = opts.scale_dtype.torch.itemsize
            total += opts.planes * (p_shape[0] * p_shape[1] + s_shape[0] * s_shape[1] * scale_bytes)
        else:
            total += info.nbytes
    return total


def _trit_config(opts: ConvertOptions, plan: dict[str, LayerReport], rotated: bool) -> fmt.TritConfig:
    kept = sorted(m for m, r in plan.items() if r.action == "kept")
    return fmt.TritConfig(
        group_size=opts.group_size,
        scale_dtype=opts.scale_dtype,
        method=Method(opts.method).value,
        pad_policy=opts.pad_policy,
        planes=opts.planes,
        modules_not_converted=ALWAYS_KEPT + tuple(kept),
        lm_head=opts.lm_head,
        extra={"rotation": {"seed": ROTATION_SEED}} if rotated else {},
    )


def convert(
    model_dir: str | Path,
    out_dir: str | Path,
    options: ConvertOptions | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> ConvertReport:
    """Convert ``model_dir`` into a trit checkpoint at ``out_dir``; see the module docstring."""
    opts = options or ConvertOptions()
    fmt.check_group_size(opts.group_size, "--group-size")
    src, out = Path(model_dir), Path(out_dir)
    ckpt = open_float_source(src, out, opts.overwrite)
    if opts.planes not in (1, 2):
        raise ConvertError(f"--planes {opts.planes}: trit stores 1 or 2 ternary planes")
    if opts.passes < 1:
        raise ConvertError(f"--passes {opts.passes}: GPTQ needs at least one rounding pass")
    check_float_source(ckpt)  # every tensor the model needs, of its shape and a float dtype (headers only)
    plan = _plan(ckpt, opts)
    report = ConvertReport(out)
    start = time.perf_counter()
    log(f"quantizing {src} -> {out}: {Method(opts.method).value}, group {opts.group_size}, {opts.planes} plane(s)")
    rotation = choose_rotation(ckpt, opts.rotate, opts.rotates)
    precomputed: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    with ExitStack() as stack:
        rotate, rotate_for_calibration = rotation_maps(ckpt, rotation, stack, device=opts.device)
        if Method(opts.method) is Method.GPTQ:
            from trit.calibrate import gptq_model

            check_all_finite(ckpt, progress)  # seconds, before minutes of calibration
            todo = {m for m, r in plan.items() if r.action != "kept"}
            precomputed = gptq_model(ckpt, todo, opts.gptq(), opts.calib, opts.device, progress,
                                      rotate_for_calibration)

        def quantized(name: str) -> bool:
            module, leaf = name.rsplit(".", 1)
            return leaf == "weight" and module in plan and plan[module].action != "kept"

        def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
            if quantized(name) and name.rsplit(".", 1)[0] in precomputed:  # GPTQ rotated it already: no second pass
                return _quantize_layer(name.rsplit(".", 1)[0], tensor, opts, report, precomputed)
            out = {}
            # a weight to be made ternary is rotated in float32; kept tensors keep the source's dtype
            for n, t in rotate(name, tensor.float() if quantized(name) else tensor).items():
                if quantized(n):
                    out |= _quantize_layer(n.rsplit(".", 1)[0], t, opts, report, precomputed)
                else:
                    out[n] = t.contiguous()
            return out

        config = dict(ckpt.config, quantization_config=_trit_config(opts, plan, rotation is not None).to_dict())
        if rotation is not None:
            config = rotated_config(config)
        needed = _output_bytes(ckpt, plan, opts) + (tied_head_bytes(ckpt) if rotation is not None else 0)
        write_checkpoint(ckpt, out, transform, config, progress, needed=needed)
    report.layers = sorted(plan.values(), key=lambda r: r.name)
    report.seconds = time.perf_counter() - start
    return report
