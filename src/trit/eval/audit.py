"""The audit: reconcile a trit checkpoint's config with its tensors, value by value.

Checks, each a row of the report: the quantization config parses (format 1);
the architecture is supported; every tensor the model needs is there and
nothing else is; each ternary layer's codes and scales have the dtype and
shape its layer size and group size call for; no code is 3; padded columns are
zero weights; scales are finite and positive; layers listed as not converted
are float and the others ternary; float tensors are finite. The expected layer
sizes come from the model built on the meta device from config.json.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trit import format as fmt
from trit.arch import check_architecture, is_decoder_linear, load_tokenizer, meta_model
from trit.checkpoint import CONFIG_FILE, Checkpoint, CheckpointError, open_checkpoint


@dataclass
class Check:
    name: str
    checked: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class AuditReport:
    path: Path
    checks: list[Check] = field(default_factory=list)
    bits_per_weight: float | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        self.checks.append(Check(name))
        return self.checks[-1]

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"audit of {self.path}", f"  {'check':<{width}}  {'items':>6}  result"]
        for c in self.checks:
            result = "ok" if c.ok else f"FAIL ({len(c.failures)})"
            lines.append(f"  {c.name:<{width}}  {c.checked:>6}  {result}")
        for c in self.checks:
            lines += [f"  FAIL {c.name}: {f}" for f in c.failures[:20]]
            if len(c.failures) > 20:
                lines.append(f"  ... and {len(c.failures) - 20} more failures of {c.name}")
        if self.bits_per_weight is not None:
            lines.append(f"  ternary layers: {self.bits_per_weight:.3f} bits per weight including scales")
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def _guard(check: Check, fn: Callable[..., None], *args: object) -> bool:
    """Run one check of one item; record its failure. True if it passed."""
    check.checked += 1
    try:
        fn(*args)
    except (fmt.FormatError, CheckpointError) as e:
        check.failures.append(str(e))
        return False
    return True


def audit(path: str | Path, values: bool = True) -> AuditReport:
    """Audit a trit checkpoint; ``values=False`` checks names, dtypes and shapes from the headers only."""
    report = AuditReport(Path(path))
    head = report.check("checkpoint files and config")
    head.checked = 1
    try:
        ckpt = open_checkpoint(path)
        check_architecture(ckpt.config, str(ckpt.path / CONFIG_FILE))
        qcfg = ckpt.trit_config()
        if qcfg is None:
            raise fmt.FormatError(f"{ckpt.path / CONFIG_FILE}: quantization_config", "a trit config", "none")
    except (fmt.FormatError, CheckpointError) as e:
        head.failures.append(str(e))
        return report
    _guard(report.check("tokenizer, vocabulary fits the embedding"), load_tokenizer, ckpt)
    model = meta_model(ckpt)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    ternary = fmt.layer_names(ckpt.tensors)
    _check_names(report.check("tensors present and known"), ckpt, model, ternary, qcfg)
    _check_policy(report.check("ternary vs modules_not_converted"), ckpt, qcfg, linears, ternary)
    with ExitStack() as stack:
        files = ckpt.open_all(stack) if values else {}

        def get(name: str) -> torch.Tensor:
            info = ckpt.tensors[name]
            return files[info.shard].get_tensor(name) if values else info.meta()

        layout, codes, scales, pads = (report.check(n) for n in (
            "layer layout (dtype, shape)", "codes in {0,1,2}", "scales finite, positive, dtype", "padding is zero"))
        packed_bytes = scale_bytes = weights = 0
        for layer in ternary:
            for suffixes in fmt.plane_suffixes(qcfg.planes_of(layer)):
                names = tuple(f"{layer}.{x}" for x in suffixes)
                if layer not in linears or any(n not in ckpt.tensors for n in names):
                    continue  # reported by the name checks
                lin = linears[layer]
                p, s = get(names[0]), get(names[1])
                n, k = lin.out_features, lin.in_features
                if not _guard(layout, fmt.check_layer, layer, p, s, qcfg.group_size, n, k, False, suffixes):
                    continue
                packed_bytes += p.numel()
                scale_bytes += s.numel() * s.element_size()
                weights += n * k if suffixes[0] == fmt.PACKED_SUFFIX else 0  # weights count once, bytes per plane
                if values:
                    _guard(codes, _check_codes, names[0], p)
                    _guard(scales, _check_scales, names[1], s, qcfg)
                    _guard(pads, fmt.check_padding, names[0], p, k)
        floats = report.check("float tensors finite")
        for name in ckpt.tensors if values else ():
            if not name.endswith(fmt.TERNARY_SUFFIXES):
                _guard(floats, fmt.check_finite, name, get(name))
        if not values:  # no values read: these checks did not run, and say so
            report.checks = [c for c in report.checks if c.checked]
    report.bits_per_weight = fmt.bits_per_weight(packed_bytes, scale_bytes, weights)
    return report


def _check_names(check: Check, ckpt: Checkpoint, model: nn.Module, ternary: list[str], qcfg: fmt.TritConfig) -> None:
    expected = set(model.state_dict())
    for layer in ternary:  # a ternary layer stores codes and scales (each plane) in place of its weight
        expected.discard(f"{layer}.weight")
        expected |= {f"{layer}.{x}" for pair in fmt.plane_suffixes(qcfg.planes_of(layer)) for x in pair}
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    check.checked = len(expected | set(ckpt.tensors))
    check.failures += [f"{n}: expected a tensor in the checkpoint, found none" for n in sorted(expected - set(ckpt.tensors) - tied)]
    check.failures += [f"{n}: expected no such tensor (not part of the model)" for n in sorted(set(ckpt.tensors) - expected)]


def _check_policy(check: Check, ckpt: Checkpoint, qcfg: fmt.TritConfig, linears: dict, ternary: list[str]) -> None:
    for name in linears:
        check.checked += 1
        listed = not qcfg.is_converted(name)
        if name in ternary and listed:
            check.failures.append(f"{name}: listed in modules_not_converted, but stored ternary")
        elif name not in ternary and not listed and is_decoder_linear(name):
            check.failures.append(f"{name}: expected ternary (not in modules_not_converted), found a float weight")


def _check_codes(name: str, packed: torch.Tensor) -> None:
    bad = fmt.count_invalid_codes(packed)
    if bad:
        raise fmt.FormatError(name, "2-bit codes in {0, 1, 2}", f"{bad} codes equal to 3")


def _check_scales(name: str, scale: torch.Tensor, qcfg: fmt.TritConfig) -> None:
    if scale.dtype != qcfg.scale_dtype.torch:
        raise fmt.FormatError(name, f"dtype {qcfg.scale_dtype.value} (the config's scale_dtype)",
                              str(scale.dtype).removeprefix("torch."))
    if not torch.isfinite(scale).all():
        raise fmt.FormatError(name, "finite scales", f"{int((~torch.isfinite(scale)).sum())} NaN or Inf")
    if not (scale > 0).all():
        raise fmt.FormatError(name, "positive scales", f"{int((scale <= 0).sum())} zero or negative")
