"""``TritLinear``, the ternary ``nn.Linear``, and the function that swaps it into a model; ``W4A8Linear``, the
W4A8 recipe's layer as a plain-PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn

import trit.ops  # registers torch.ops.trit.linear; warm_up
from trit import format as fmt
from trit.kernels import int8_rows
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda import mma


class TritLinear(nn.Module):
    """A linear layer whose weight is ternary codes (``weight_packed``) times group scales (``weight_scale``).

    The codes and scales are buffers in the file layout of :mod:`trit.format`;
    the forward pass is one call of ``torch.ops.trit.linear`` a trit-plane (:func:`trit.ops.linear_planes`). With
    ``activation=INT8_PER_TOKEN`` the inputs are quantized to int8 per token
    (BitNet's W1.58A8) inside the op.

    :meth:`tile` repacks a loaded layer for inference into the CUDA kernels' mma layout
    (:mod:`trit.kernels.cuda.mma`): the same weights, in place of the file layout's buffers, and the forward
    pass calls ``torch.ops.trit.linear_tiled``. A tiled layer has no file-layout state to save.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        group_size: int = fmt.DEFAULT_GROUP_SIZE,
        scale_dtype: torch.dtype = torch.float16,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        activation: fmt.ActivationQuant = fmt.ActivationQuant.NONE,
        planes: int = 1,
    ):
        super().__init__()
        fmt.check_group_size(group_size, "group_size")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.activation = fmt.ActivationQuant(activation)
        self.act_int8 = self.activation is fmt.ActivationQuant.INT8_PER_TOKEN
        p_shape, s_shape = fmt.expected_shapes(out_features, in_features, group_size)
        self.planes = planes
        for packed_name, scale_name in fmt.plane_suffixes(planes):
            self.register_buffer(packed_name, torch.empty(p_shape, dtype=torch.uint8, device=device))
            self.register_buffer(scale_name, torch.empty(s_shape, dtype=scale_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self.tiled = False

    def planes_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each trit-plane's ``(packed, scale)`` buffers."""
        if self.tiled:
            raise RuntimeError("this layer is in the mma layout (TritLinear.tile): it has no format-v1 buffers")
        return [(getattr(self, p), getattr(self, s)) for p, s in fmt.plane_suffixes(self.planes)]

    def planes_for_forward(self) -> list[trit.ops.Plane]:
        """What the forward pass multiplies by: each plane's ``(packed, scale)``, or its mma layout once tiled."""
        if not self.tiled:
            return self.planes_tensors()
        return [mma.MmaWeights(getattr(self, f"tiles_{i}_codes"), getattr(self, f"tiles_{i}_scales"),
                               self.out_features, self.in_features, self.group_size) for i in range(self.planes)]

    def tile_refusal(self, dtype: torch.dtype) -> str | None:
        """Why :meth:`tile` would leave this layer in format v1 for activations of ``dtype`` (``None``: it tiles)."""
        if self.tiled:
            return "tiled already"
        device = getattr(self, fmt.plane_suffixes(self.planes)[0][0]).device
        return cuda_launch.tile_refusal(device, dtype, self.group_size, self.in_features, self.act_int8,
                                        self.out_features)

    def tile(self) -> None:
        """Repack every plane into the mma layout, in place of the format-v1 buffers (for inference)."""
        for i, (packed_name, scale_name) in enumerate(fmt.plane_suffixes(self.planes)):
            r = mma.repack(getattr(self, packed_name), getattr(self, scale_name), self.group_size, self.in_features)
            self.register_buffer(f"tiles_{i}_codes", r.wq, persistent=False)
            self.register_buffer(f"tiles_{i}_scales", r.sc, persistent=False)
            delattr(self, packed_name)
            delattr(self, scale_name)
        self.tiled = True
        self.register_state_dict_pre_hook(_refuse_tiled_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return trit.ops.linear_planes(x, self.planes_for_forward(), self.group_size, self.bias, self.act_int8)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, activation={self.activation.value}, "
            f"planes={self.planes}" + (", layout=mma" if self.tiled else "")
        )


def _refuse_tiled_state(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    raise RuntimeError(f"{prefix.rstrip('.') or 'the layer'} is in the mma layout for inference (TritLinear.tile): "
                       f"it has no format-v1 state to save; load with TRIT_LAYOUT=v1 to save or train")


def tile(model: nn.Module, dtype: torch.dtype) -> tuple[int, str | None]:
    """:meth:`TritLinear.tile` every ternary layer that can be: (layers tiled, why the first refused one was not)."""
    done, why = 0, None
    for mod in model.modules():
        if isinstance(mod, TritLinear):
            reason = mod.tile_refusal(dtype)
            if reason is None:
                mod.tile()
                done += 1
            elif why is None:
                why = reason
    return done, why


def use_int8_head(model: nn.Module, where: str) -> None:
    """The output layer replaced by its int8 rows (``quantization_config.lm_head = "int8"``); a tied one: the
    embeddings keep the float matrix. ``where`` names the config in the error for a head that cannot be."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise fmt.FormatError(f"{where}: quantization_config.lm_head",
                              "'stored' for an output layer that is not a linear layer without bias", "'int8'")
    new = int8_rows.Int8RowsLinear(head.weight)
    model.set_output_embeddings(new)
    int8_rows.warm_up(new.q, new.s, head.weight.dtype)


def swap_linears(model: nn.Module, names: list[str], config: fmt.TritConfig) -> None:
    """Replace each ``nn.Linear`` named in ``names`` by an empty :class:`TritLinear` on the same device."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child, None)
        if not isinstance(old, nn.Linear):
            raise fmt.FormatError(
                f"{name}.{fmt.PACKED_SUFFIX}", "a tensor for one of the model's linear layers",
                f"{type(old).__name__ if old is not None else 'no such module'} at {name}",
            )
        new = TritLinear(
            old.in_features, old.out_features, old.bias is not None, config.group_size,
            config.scale_dtype.torch, old.weight.dtype, old.weight.device, config.activation, config.planes,
        )
        setattr(parent, child, new)


class W4A8Linear(nn.Module):
    """A W4A8 int layer computed as vLLM's int8 path computes it, in plain PyTorch (the reference, not fast).

    ``weight``: int4 codes ``(N, K)`` stored one per int8; ``weight_scale``: ``(N, G)`` (``G = 1``: channel-wise)
    in the model's dtype (:mod:`trit.compressed`). The input is quantized per token to int8 (symmetric, scale
    ``max|x| / 127``, round half to even), multiplied by the dequantized weight, and scaled back.
    The float weight is made at the first forward and kept.
    """

    def __init__(self, in_features: int, out_features: int, groups: int, bias: bool = False,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        if groups < 1 or in_features % groups:
            raise ValueError(f"{groups} groups do not divide in_features {in_features}")
        self.in_features, self.out_features, self.groups = in_features, out_features, groups
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.empty(out_features, groups, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self._float: torch.Tensor | None = None

    def dequantized(self) -> torch.Tensor:  # (N, K) float32
        if self._float is None or self._float.device != self.weight.device:
            self._float = fmt.apply_scales(self.weight.float(), self.weight_scale.float())
        return self._float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        s = (xf.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-10)
        xq = torch.clamp(torch.round(xf / s), -128, 127)
        y = (xq @ self.dequantized().T) * s
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, groups={self.groups}"


def warm_up(model: nn.Module, dtype: torch.dtype) -> int:
    """:func:`trit.ops.warm_up` for every distinct :class:`TritLinear` shape of ``model``; the calls made."""
    calls = 0
    for mod in model.modules():
        if isinstance(mod, TritLinear):
            for plane in mod.planes_for_forward():
                calls += trit.ops.warm_up(mod.in_features, plane, mod.group_size, dtype, mod.act_int8)
    return calls
