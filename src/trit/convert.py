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
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trit import format as fmt
from trit.arch import check_float_source, is_decoder_linear, open_float_source
from trit.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_all_finite,
    write_checkpoint,
)
from trit.configs import GPTQConfig, Layout, TernaryConfig
from trit.errors import ConvertError
from trit.quant import quantize
from trit.quant.planes import quantize_planes
from trit.quant.rotate import rotated_config
from trit.rotation import ROTATION_SEED, choose_rotation, rotation_maps, tied_head_bytes

ALWAYS_KEPT = ("model.embed_tokens", "lm_head")


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
    two_planes: list[str] = field(default_factory=list)  # the layers a bits budget gave a second plane

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
        if self.two_planes:
            lines.append(f"  bits budget: a second plane in {len(self.two_planes)} of "
                         f"{counts['ternary'] + counts['padded']} layers")
        for layer in self.layers:
            if layer.action != "ternary":
                lines.append(f"  {layer.action:>6}  {layer.name} {layer.shape[0]}x{layer.shape[1]}: {layer.reason}")
        return "\n".join(lines)


def _plan(ckpt: Checkpoint, group_size: int, layout: Layout) -> dict[str, LayerReport]:
    """Decide, before reading any data, what happens to each decoder linear layer."""
    modules = {name.rsplit(".", 1)[0] for name in ckpt.tensors}
    unmatched = [p for p in layout.keep if not any(fnmatch.fnmatchcase(m, p) for m in modules)]
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
        if any(fnmatch.fnmatchcase(module, p) for p in layout.keep):
            plan[module] = LayerReport(module, (n, k), "kept", "--keep")
        elif k != fmt.padded_k(k, group_size):
            if layout.pad_policy is fmt.PadPolicy.KEEP:
                why = f"K={k} is not a multiple of group {group_size}; --pad keep"
                plan[module] = LayerReport(module, (n, k), "kept", why)
            else:
                why = f"K={k} padded to {fmt.padded_k(k, group_size)} with zero weights"
                plan[module] = LayerReport(module, (n, k), "padded", why)
        else:
            plan[module] = LayerReport(module, (n, k), "ternary")
    if not any(r.action != "kept" for r in plan.values()):
        raise ConvertError(f"{ckpt.path}: no linear layer left to quantize")
    narrowest = min((r for r in plan.values() if r.action != "kept"), key=lambda r: r.shape[1])
    k = narrowest.shape[1]
    if group_size != fmt.PER_ROW and group_size > fmt.padded_k(k, 16):  # rows padded to a group larger than they are
        raise ConvertError(f"--group-size {group_size}: larger than the rows of {narrowest.name} (K={k}), which would "
                           f"be padded with {group_size - k} zero weights each; use a group of at most {k}, or -1 for "
                           "one scale a row")
    return plan


def _quantize_layer(
    module: str, weight: torch.Tensor, config: TernaryConfig, layout: Layout, report: ConvertReport,
    precomputed: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    n, k = weight.shape
    g = config.group_size
    if module in precomputed:  # calibrated (GPTQ): codes (P, N, K_pad), scales (P, N, G)
        codes, scales = precomputed.pop(module)
        planes = [(codes[p], scales[p]) for p in range(codes.shape[0])]
    else:
        w = fmt.pad_k(weight.to(config.device, torch.float32), fmt.padded_k(k, g))
        fits = quantize_planes(w, g) if config.planes == 2 else [quantize(w, g, config.method)]
        planes = [(t.values, t.scales) for t in fits]
    out = {}
    for (packed_name, scale_name), (values, scales) in zip(fmt.plane_suffixes(len(planes)), planes):
        packed = fmt.pack(values).cpu()  # (N, K_pad//4) uint8
        scale = fmt.to_scale(scales, layout.scale_dtype, module).cpu()  # (N, G)
        report.packed_bytes += packed.numel()
        report.scale_bytes += scale.numel() * scale.element_size()
        out |= {f"{module}.{packed_name}": packed, f"{module}.{scale_name}": scale}
    report.ternary_weights += n * k
    return out


def _plane_bytes(layer: LayerReport, group_size: int, layout: Layout) -> int:
    """One plane of a ternary layer as stored: codes and scales."""
    (p_shape, s_shape) = fmt.expected_shapes(*layer.shape, group_size)
    return p_shape[0] * p_shape[1] + s_shape[0] * s_shape[1] * layout.scale_dtype.torch.itemsize


def _output_bytes(ckpt: Checkpoint, plan: dict[str, LayerReport], config: TernaryConfig, layout: Layout,
                  planes: Mapping[str, int]) -> int:
    """About how large the output is: ternary layers at their packed size, everything else as it is."""
    total = 0
    for name, info in ckpt.tensors.items():
        module = name.rsplit(".", 1)[0]
        layer = plan.get(module)
        if layer is not None and layer.action != "kept" and name.endswith(".weight"):
            total += planes.get(module, config.planes) * _plane_bytes(layer, config.group_size, layout)
        else:
            total += info.nbytes
    return total


def _check_bits(bits: float, plan: dict[str, LayerReport], group_size: int, layout: Layout) -> None:
    """A bits budget between one plane everywhere and two, for this model's layers."""
    ternary = [r for r in plan.values() if r.action != "kept"]
    one = 8 * sum(_plane_bytes(r, group_size, layout) for r in ternary) / sum(r.shape[0] * r.shape[1] for r in ternary)
    if not one < bits < 2 * one:
        raise ConvertError(f"--bits {bits:g}: expected more than one plane's {one:.3f} and less than two planes' "
                           f"{2 * one:.3f} bits a weight (these layers, group {group_size})")


def _bits_budget(ckpt: Checkpoint, todo: set[str], config: GPTQConfig, layout: Layout, progress: bool,
                 rotate, log: Callable[[str], None], ids: torch.Tensor) -> dict[str, int]:
    """The calibration pass over the windows ``ids`` that measures what a second plane buys in each group of
    layers, and the layers the budget gives one (:mod:`trit.quant.budget`)."""
    from trit.calibrate import gptq_model, output_fisher
    from trit.quant import budget

    gains: list[budget.PlaneGain] = []
    log(f"bits budget {config.bits:g}: measuring each layer's output sensitivity (a float forward and backward)")
    fisher = output_fisher(ckpt, todo, config.calib, config.device, progress, ids=ids)
    log(f"bits budget {config.bits:g}: measuring what a second plane buys in each layer (a first GPTQ pass)")
    gptq_model(ckpt, todo, config.gptq(), config.calib, config.device, progress, rotate, gains=gains, fisher=fisher,
               ids=ids)
    two = budget.choose(gains, config.bits, 8 * layout.scale_dtype.torch.itemsize)
    log(f"bits budget {config.bits:g}: a second plane for {len(two)} of {len(todo)} layers")
    return {m: 2 for m in sorted(two)}


def _trit_config(config: TernaryConfig, layout: Layout, plan: dict[str, LayerReport],
                 rotated: bool, planes: Mapping[str, int]) -> fmt.TritConfig:
    kept = sorted(m for m, r in plan.items() if r.action == "kept")
    return fmt.TritConfig(
        group_size=config.group_size,
        scale_dtype=layout.scale_dtype,
        method=config.method.value,
        pad_policy=layout.pad_policy,
        planes=config.planes,
        layer_planes=tuple(planes.items()),
        modules_not_converted=ALWAYS_KEPT + tuple(kept),
        lm_head=layout.lm_head,
        activation=layout.activations,
        extra={"rotation": {"seed": ROTATION_SEED}} if rotated else {},
    )


def convert(
    model_dir: str | Path,
    out_dir: str | Path,
    config: TernaryConfig | None = None,
    layout: Layout = Layout(),
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> ConvertReport:
    """Convert ``model_dir`` into a trit checkpoint at ``out_dir`` by ``config`` (:class:`GPTQConfig` by default:
    data-free calibration); see the module docstring."""
    config = config or GPTQConfig()
    if not isinstance(config, TernaryConfig):
        raise TypeError(f"expected AbsmeanConfig, TWNConfig or GPTQConfig, found {type(config).__name__}")
    fmt.check_group_size(config.group_size, "--group-size")
    src, out = Path(model_dir), Path(out_dir)
    ckpt = open_float_source(src, out, overwrite)
    check_float_source(ckpt)  # every tensor the model needs, of its shape and a float dtype (headers only)
    if isinstance(config, GPTQConfig) and config.calib.file is not None:
        from trit.calibrate import calibration_text

        calibration_text(config.calib.file)  # readable text, before anything heavy
    plan = _plan(ckpt, config.group_size, layout)
    bits = getattr(config, "bits", None)
    if bits is not None:
        _check_bits(bits, plan, config.group_size, layout)
    report = ConvertReport(out)
    start = time.perf_counter()
    log(f"quantizing {src} -> {out}: {config.method.value}, group {config.group_size}, "
        + (f"a bits budget of {bits:g}" if bits is not None else f"{config.planes} plane(s)"))
    rotation = choose_rotation(ckpt, config.rotate, config.rotates)
    precomputed: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    planes: dict[str, int] = {}  # the layers whose plane count is not config.planes
    with ExitStack() as stack:
        rotate, rotate_for_calibration = rotation_maps(ckpt, rotation, stack, device=config.device)
        if isinstance(config, GPTQConfig):
            from trit.calibrate import calibration_ids, gptq_model

            check_all_finite(ckpt, progress)  # seconds, before minutes of calibration
            todo = {m for m, r in plan.items() if r.action != "kept"}
            ids = calibration_ids(ckpt, config.calib, config.device, progress)  # once, for every pass below
            if bits is not None:
                planes = _bits_budget(ckpt, todo, config, layout, progress, rotate_for_calibration, log, ids)
            precomputed = gptq_model(ckpt, todo, config.gptq(), config.calib, config.device, progress,
                                      rotate_for_calibration, planes=planes, ids=ids)

        def quantized(name: str) -> bool:
            module, leaf = name.rsplit(".", 1)
            return leaf == "weight" and module in plan and plan[module].action != "kept"

        def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
            if quantized(name) and name.rsplit(".", 1)[0] in precomputed:  # GPTQ rotated it already: no second pass
                return _quantize_layer(name.rsplit(".", 1)[0], tensor, config, layout, report, precomputed)
            out = {}
            # a weight to be made ternary is rotated in float32; kept tensors keep the source's dtype
            for n, t in rotate(name, tensor.float() if quantized(name) else tensor).items():
                if quantized(n):
                    out |= _quantize_layer(n.rsplit(".", 1)[0], t, config, layout, report, precomputed)
                else:
                    out[n] = t.contiguous()
            return out

        qcfg = _trit_config(config, layout, plan, rotation is not None, planes).to_dict()
        hf_config = dict(ckpt.config, quantization_config=qcfg)
        if rotation is not None:
            hf_config = rotated_config(hf_config)
        needed = _output_bytes(ckpt, plan, config, layout, planes) + (tied_head_bytes(ckpt) if rotation is not None else 0)
        write_checkpoint(ckpt, out, transform, hf_config, progress, needed=needed)
    report.layers = sorted(plan.values(), key=lambda r: r.name)
    report.two_planes = sorted(planes)
    report.seconds = time.perf_counter() - start
    return report
