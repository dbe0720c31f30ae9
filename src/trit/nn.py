"""``TritLinear``, the ternary ``nn.Linear``, and the function that swaps it into a model."""

from __future__ import annotations

import torch
from torch import nn

import trit.ops  # registers torch.ops.trit.linear; warm_up
from trit import format as fmt


class TritLinear(nn.Module):
    """A linear layer whose weight is ternary codes (``weight_packed``) times group scales (``weight_scale``).

    The codes and scales are buffers in the file layout of :mod:`trit.format`;
    the forward pass is one call of ``torch.ops.trit.linear`` a trit-plane (:func:`trit.ops.linear_planes`). With
    ``activation=INT8_PER_TOKEN`` the inputs are quantized to int8 per token
    (BitNet's W1.58A8) inside the op.
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

    def planes_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each trit-plane's ``(packed, scale)`` buffers."""
        return [(getattr(self, p), getattr(self, s)) for p, s in fmt.plane_suffixes(self.planes)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return trit.ops.linear_planes(x, self.planes_tensors(), self.group_size, self.bias, self.act_int8)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, activation={self.activation.value}, "
            f"planes={self.planes}"
        )


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


def warm_up(model: nn.Module, dtype: torch.dtype) -> int:
    """:func:`trit.ops.warm_up` for every distinct :class:`TritLinear` shape of ``model``; the calls made."""
    calls = 0
    for mod in model.modules():
        if isinstance(mod, TritLinear):
            for packed, scale in mod.planes_tensors():
                calls += trit.ops.warm_up(mod.in_features, packed, scale, mod.group_size, dtype, mod.act_int8)
    return calls
