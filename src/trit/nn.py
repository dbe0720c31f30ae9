"""``TritLinear``, the ternary ``nn.Linear``, and the function that swaps it into a model; ``W4A8Linear``, the
W4A8 recipe's layer as a plain-PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn

from trit import format as fmt
from trit import linear
from trit.kernels import int8_rows


class TritLinear(nn.Module):
    """A linear layer whose weight is ternary codes (``weight_packed``) times group scales (``weight_scale``).

    The codes and scales are buffers in the file layout of :mod:`trit.format` (a pair a trit-plane), which a
    fresh layer's forward reads (:class:`trit.linear.PackedLinear`: trainable and savable). With
    ``activation=INT8_PER_TOKEN`` the inputs are quantized to int8 per token (BitNet's W1.58A8) inside the op.

    :meth:`prepare` binds a loaded layer to the layout :mod:`trit.linear` chooses for inference, repacking it in
    place (the CUDA kernels' mma layout where they run): a layer in another layout than format v1 has no
    file-layout state to save.
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
        self.spec = linear.LinearSpec(out_features, in_features, group_size, planes, self.act_int8)
        self.trit_kernel: linear.LinearKernel = linear.PackedLinear(self.spec)

    @property
    def layout(self) -> str:
        """The layout the layer is held in: ``"v1"`` (as stored) or ``"mma"`` (repacked for the CUDA kernels)."""
        return self.trit_kernel.name

    def planes_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each trit-plane's ``(packed, scale)`` buffers in format v1."""
        if not isinstance(self.trit_kernel, linear.PackedLinear):
            raise RuntimeError(f"this layer is in the {self.layout} layout (TritLinear.prepare): it has no format-v1 "
                               "buffers")
        return self.trit_kernel.planes(self)

    def prepare(self, dtype: torch.dtype) -> linear.LayoutChoice:
        """Hold the loaded layer in the layout :func:`trit.linear.choose` picks for activations of ``dtype`` (once)."""
        if not isinstance(self.trit_kernel, linear.PackedLinear):
            raise RuntimeError(f"this layer is prepared already (the {self.layout} layout)")
        device = getattr(self, fmt.PACKED_SUFFIX).device
        choice = linear.prepare(self, self.spec, device, dtype)
        if not isinstance(self.trit_kernel, linear.PackedLinear):
            self.register_state_dict_pre_hook(_refuse_prepared_state)
        return choice

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        return self.trit_kernel.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, activation={self.activation.value}, "
            f"planes={self.planes}" + (f", layout={self.layout}" if self.layout != "v1" else "")
        )


def _refuse_prepared_state(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    raise RuntimeError(f"{prefix.rstrip('.') or 'the layer'} is in the {module.layout} layout for inference "
                       "(TritLinear.prepare): it has no format-v1 state to save; load with TRIT_LAYOUT=v1 to save "
                       "or train")


def prepare(model: nn.Module, dtype: torch.dtype) -> tuple[int, str | None]:
    """:meth:`TritLinear.prepare` every ternary layer: (layers held in another layout than format v1, why the
    first one left in format v1 was)."""
    moved, why = 0, None
    for mod in model.modules():
        if isinstance(mod, TritLinear):
            choice = mod.prepare(dtype)
            if mod.layout != "v1":
                moved += 1
            elif why is None and choice.refused:
                why = choice.refused[0][1]
    return moved, why


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
            config.scale_dtype.torch, old.weight.dtype, old.weight.device, config.activation, config.planes_of(name),
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
    """:meth:`trit.linear.LinearKernel.warm_up` for every distinct :class:`TritLinear` shape of ``model``; the calls
    made."""
    return sum(mod.trit_kernel.warm_up(mod, dtype) for mod in model.modules() if isinstance(mod, TritLinear))
