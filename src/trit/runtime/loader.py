"""Loading: a trit checkpoint (or a float one) into a Hugging Face transformers model.

:func:`load` builds the model from its config on the meta device, swaps a
:class:`~trit.nn.TritLinear` in for every ternary layer, then reads the
checkpoint tensor by tensor straight to the target device. No float copy of a
ternary weight is ever made: the codes stay packed, two bits a weight. A float
Hugging Face checkpoint loads through the same function, so the two can be
compared by every command.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trit import format as fmt
from trit.arch import check_architecture, materialize_buffers, meta_model, tied_names
from trit.checkpoint import CONFIG_FILE, Checkpoint, open_checkpoint
from trit.nn import TritLinear, swap_linears, warm_up
from trit.ops import warm_up_wanted


@dataclass
class Loaded:
    model: nn.Module  # a transformers *ForCausalLM
    tokenizer: Any
    trit_config: fmt.TritConfig | None  # None for a float checkpoint
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
) -> Loaded:
    """Load a trit (or float) checkpoint folder for inference; see the module docstring.

    ``warm``: run each layer shape's kernels once now (:func:`trit.ops.warm_up`) so the first request does
    not compile them; ``None`` follows ``TRIT_WARMUP`` (on by default on CUDA).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device or default_device())
    dtype = dtype or default_dtype(device)
    ckpt = open_checkpoint(path)
    check_architecture(ckpt.config, str(ckpt.path / CONFIG_FILE))
    qcfg = ckpt.trit_config()
    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    if qcfg is None:
        model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=dtype).to(device).eval()
        return Loaded(model, tokenizer, None, ckpt)
    model = meta_model(ckpt, dtype)
    names = fmt.layer_names(ckpt.tensors)
    swap_linears(model, names, qcfg)
    _load_tensors(model, ckpt, qcfg, device, dtype, validate)
    materialize_buffers(model, device)
    if warm_up_wanted(device) if warm is None else warm:  # compile the kernels now, not in the first request
        warm_up(model, dtype)
    return Loaded(model.eval(), tokenizer, qcfg, ckpt)


def _load_tensors(
    model: nn.Module, ckpt: Checkpoint, qcfg: fmt.TritConfig, device: torch.device, dtype: torch.dtype,
    validate: bool,
) -> None:
    expected = model.state_dict(keep_vars=True)
    tied = tied_names(model)
    unexpected = sorted(set(ckpt.tensors) - set(expected))
    if unexpected:
        raise fmt.FormatError(unexpected[0], f"a tensor of the {type(model).__name__} model", "an unknown name")
    missing = sorted(set(expected) - set(ckpt.tensors) - tied)
    if missing:
        raise fmt.FormatError(missing[0], "a tensor in the checkpoint", "none")
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        files = ckpt.open_all(stack, device=str(device))
        for name, info in ckpt.tensors.items():
            t = files[info.shard].get_tensor(name)
            if t.is_floating_point() and name.rsplit(".", 1)[1] not in fmt.TERNARY_SUFFIXES:
                if validate:
                    fmt.check_finite(name, t)
                t = t.to(dtype)
            state[name] = t
    for layer in fmt.layer_names(ckpt.tensors):
        mod = model.get_submodule(layer)
        assert isinstance(mod, TritLinear)
        for packed_name, scale_name in fmt.plane_suffixes(qcfg.planes):
            fmt.check_layer(
                layer, state[f"{layer}.{packed_name}"], state[f"{layer}.{scale_name}"],
                qcfg.group_size, mod.out_features, mod.in_features, check_values=validate,
                suffixes=(packed_name, scale_name),
            )
    for name, t in state.items():
        want = expected[name]
        if name.endswith(fmt.TERNARY_SUFFIXES):
            continue
        if tuple(t.shape) != tuple(want.shape):
            raise fmt.FormatError(name, f"shape {tuple(want.shape)}", f"{tuple(t.shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
