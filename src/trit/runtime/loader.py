"""Loading: a trit checkpoint (or a float one) into a Hugging Face transformers model.

:func:`load` builds the model from its config on the meta device, swaps a
:class:`~trit.nn.TritLinear` in for every ternary layer, then reads the
checkpoint tensor by tensor straight to the target device. No float copy of a
ternary weight is ever made: the codes stay packed, two bits a weight. A float
Hugging Face checkpoint loads through the same function, so the two can be
compared by every command, and so does a W4A8 checkpoint (compressed-tensors,
:mod:`trit.compressed`), its layers computed by the plain-PyTorch
:class:`~trit.nn.W4A8Linear`.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trit import compressed
from trit import format as fmt
from trit.arch import (
    FLOAT_DTYPES,
    check_architecture,
    check_float_source,
    load_tokenizer,
    materialize_buffers,
    meta_model,
    tied_names,
)
from trit.checkpoint import CONFIG_FILE, Checkpoint, open_checkpoint
from trit.kernels import int8_rows
from trit.linear import warm_up_wanted
from trit.nn import TritLinear, W4A8Linear, prepare, swap_linears, use_int8_head, warm_up


@dataclass
class Loaded:
    model: nn.Module  # a transformers *ForCausalLM
    tokenizer: Any
    trit_config: fmt.TritConfig | None  # None for a float (or W4A8) checkpoint
    checkpoint: Checkpoint

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on a GPU; float32 on a CPU, where bf16 matmuls are emulated on most chips and slower."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def load(
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    validate: bool = True,
    warm: bool | None = None,
    lm_head: str | None = None,
    activations: str | None = None,
) -> Loaded:
    """Load a trit (or float) checkpoint folder for inference; see the module docstring.

    ``warm``: run each layer shape's kernels once now (:meth:`trit.linear.LinearKernel.warm_up`) so the first request does
    not compile them; ``None`` follows ``TRIT_WARMUP`` (on by default on CUDA). ``lm_head``: ``"stored"`` or
    ``"int8"`` (the output layer rounded to int8 rows, :class:`trit.kernels.int8_rows.Int8RowsLinear`); ``None``
    follows ``TRIT_LM_HEAD``, else the checkpoint's ``quantization_config.lm_head``. ``activations``: ``"none"`` or
    ``"int8_per_token"`` (W1.58A8); ``None`` follows ``TRIT_ACTIVATIONS``, else the checkpoint's. A trit checkpoint
    only.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device or default_device())
    dtype = dtype or default_dtype(device)
    ckpt = open_checkpoint(path)
    check_architecture(ckpt.config, str(ckpt.path / CONFIG_FILE))
    tokenizer = load_tokenizer(ckpt)
    if compressed.is_w4a8(ckpt.quantization_config):
        return Loaded(_load_w4a8(ckpt, device, dtype, validate).eval(), tokenizer, None, ckpt)
    qcfg = ckpt.trit_config()
    if qcfg is None:
        packed = fmt.layer_names(ckpt.tensors)
        if packed:
            raise fmt.FormatError(f"{ckpt.path / CONFIG_FILE}: quantization_config",
                                  "a trit config for the packed tensors it holds "
                                  f"({packed[0]}.{fmt.PACKED_SUFFIX}, ...)", "none")
        check_float_source(ckpt)  # every weight the model needs is there: none is left to random initialisation
        model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=dtype).to(device).eval()
        return Loaded(model, tokenizer, None, ckpt)
    qcfg = dataclasses.replace(qcfg, activation=fmt.served_activation(qcfg.activation, activations))
    model = meta_model(ckpt, dtype)
    names = fmt.layer_names(ckpt.tensors)
    swap_linears(model, names, qcfg)
    _load_tensors(model, ckpt, qcfg, device, dtype, validate)
    materialize_buffers(model, device)
    prepare(model, dtype)  # each layer's layout for inference (trit.linear: the CUDA kernels' where they run)
    if lm_head is not None and lm_head not in fmt.LM_HEADS:
        raise ValueError(f"lm_head={lm_head!r}: one of {', '.join(fmt.LM_HEADS)}")
    if (lm_head or int8_rows.head_choice(qcfg.lm_head)) == "int8":
        use_int8_head(model, str(ckpt.path / CONFIG_FILE))
    if warm_up_wanted(device) if warm is None else warm:  # compile the kernels now, not in the first request
        warm_up(model, dtype)
    return Loaded(model.eval(), tokenizer, qcfg, ckpt)


def _read_state(
    model: nn.Module, ckpt: Checkpoint, device: torch.device, dtype: torch.dtype, validate: bool,
    keep_dtype: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor, on ``device``; float ones (but those named ``*.<keep_dtype>``) checked finite and
    cast to ``dtype``. Refuses a name the model does not have, and a tensor the model needs that is missing."""
    expected = model.state_dict(keep_vars=True)
    unexpected = sorted(set(ckpt.tensors) - set(expected))
    if unexpected:
        raise fmt.FormatError(unexpected[0], f"a tensor of the {type(model).__name__} model", "an unknown name")
    missing = sorted(set(expected) - set(ckpt.tensors) - tied_names(model))
    if missing:
        raise fmt.FormatError(missing[0], "a tensor in the checkpoint", "none")
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        files = ckpt.open_all(stack, device=str(device))
        for name, info in ckpt.tensors.items():
            t = files[info.shard].get_tensor(name)
            if t.is_floating_point() and name.rsplit(".", 1)[1] not in keep_dtype:
                if validate:
                    fmt.check_finite(name, t)
                t = t.to(dtype)
            state[name] = t
    return state


def _load_state(model: nn.Module, state: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    """Check each tensor's shape (but those named ``*.<skip>``, checked already) and load them into ``model``."""
    expected = model.state_dict(keep_vars=True)
    for name, t in state.items():
        if not name.endswith(skip) and tuple(t.shape) != tuple(expected[name].shape):
            raise fmt.FormatError(name, f"shape {tuple(expected[name].shape)}", f"{tuple(t.shape)}")
    tied = tied_names(model)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()


def _load_tensors(
    model: nn.Module, ckpt: Checkpoint, qcfg: fmt.TritConfig, device: torch.device, dtype: torch.dtype,
    validate: bool,
) -> None:
    state = _read_state(model, ckpt, device, dtype, validate, fmt.TERNARY_SUFFIXES)
    for layer in fmt.layer_names(ckpt.tensors):
        mod = model.get_submodule(layer)
        assert isinstance(mod, TritLinear)
        for packed_name, scale_name in fmt.plane_suffixes(qcfg.planes_of(layer)):
            fmt.check_layer(
                layer, state[f"{layer}.{packed_name}"], state[f"{layer}.{scale_name}"],
                qcfg.group_size, mod.out_features, mod.in_features, check_values=validate,
                suffixes=(packed_name, scale_name),
            )
    _load_state(model, state, fmt.TERNARY_SUFFIXES)


def _load_w4a8(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype, validate: bool) -> nn.Module:
    """A W4A8 (compressed-tensors) checkpoint: each layer with a ``weight_scale`` becomes a :class:`W4A8Linear`."""
    where = str(ckpt.path / CONFIG_FILE)
    scheme = compressed.W4A8Scheme.from_dict(ckpt.quantization_config, f"{where}: quantization_config")
    model = meta_model(ckpt, dtype)
    for name in sorted(n.removesuffix(".weight_scale") for n in ckpt.tensors if n.endswith(".weight_scale")):
        old = model.get_submodule(name)
        if not isinstance(old, nn.Linear):
            raise fmt.FormatError(f"{name}.weight_scale", "the scale of one of the model's linear layers",
                                  f"{type(old).__name__} at {name}")
        n, k = old.out_features, old.in_features
        groups = scheme.groups(k)
        for suffix, shape, kind in (("weight", (n, k), "I8"), ("weight_scale", (n, groups), None)):
            info = ckpt.tensors.get(f"{name}.{suffix}")
            if info is None:
                raise fmt.FormatError(f"{name}.{suffix}", "a tensor in the checkpoint", "none")
            dtype_ok = info.dtype == kind if kind else info.dtype in FLOAT_DTYPES
            if tuple(info.shape) != shape or not dtype_ok:
                raise fmt.FormatError(f"{name}.{suffix}", f"{'int8' if kind else 'a float'} tensor of shape {shape}",
                                      f"{info.dtype} {tuple(info.shape)}")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                W4A8Linear(k, n, groups, old.bias is not None, dtype=dtype, device="meta"))
    state = _read_state(model, ckpt, device, dtype, validate)
    if validate:
        for name, t in state.items():
            if t.dtype == torch.int8 and (t.min() < -8 or t.max() > 7):
                raise fmt.FormatError(name, "int4 codes in -8..7", f"values {int(t.min())}..{int(t.max())}")
    _load_state(model, state)
    materialize_buffers(model, device)
    return model
