"""trit checkpoints through transformers' own ``from_pretrained``: a quantization config and an ``HfQuantizer``.

After ``import trit``, ``AutoModelForCausalLM.from_pretrained(TRIT_DIR)`` reads
``quantization_config.quant_method == "trit"``, builds the model, swaps a
:class:`~trit.nn.TritLinear` in for every ternary layer before any weight is
read (the way transformers' ``bitnet`` and ``compressed-tensors`` integrations
swap theirs), and loads the packed codes and scales into it as they are. Tools
built on transformers (``pipeline``, lm-eval's ``hf`` model) then take trit
checkpoints. :func:`trit.load` is the same model with trit's own checks and
kernel warm-up.

Without ``import trit`` transformers knows no ``trit`` method; nothing in the
checkpoint can make it import trit, so tools must import it first (for lm-eval,
``python -c "import trit, lm_eval.__main__ ..."`` or its ``--include_path``
plugin hook).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trit import format as fmt
from trit.arch import is_decoder_linear
from trit.kernels import int8_rows
from trit.nn import TritLinear, prepare, swap_linears, use_int8_head

_registered = False


def _classes():
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    class TritHfConfig(QuantizationConfigMixin):
        """``quantization_config`` of a trit checkpoint, as transformers holds it; checked by :mod:`trit.format`."""

        def __init__(self, **kwargs: Any):
            trit = fmt.TritConfig.from_dict({"quant_method": fmt.QUANT_METHOD, **kwargs})
            # how the model runs (TRIT_ACTIVATIONS), not what to_dict writes back
            self.trit = dataclasses.replace(trit, activation=fmt.served_activation(trit.activation))
            self.quant_method = fmt.QUANT_METHOD
            self.modules_to_not_convert = list(self.trit.modules_not_converted)

        @classmethod
        def from_dict(cls, config_dict: dict, return_unused_kwargs: bool = False, **kwargs: Any):
            config = cls(**{k: v for k, v in config_dict.items() if k != "quant_method"})
            return (config, kwargs) if return_unused_kwargs else config

        def to_dict(self) -> dict[str, Any]:
            return self.trit.to_dict()

        def to_diff_dict(self) -> dict[str, Any]:
            return self.to_dict()

    class TritHfQuantizer(HfQuantizer):
        """Swaps the ternary layers in before loading; the checkpoint's tensors load into them unchanged."""

        requires_calibration = True  # a trit checkpoint is quantized already: trit quantize makes one

        def _process_model_before_weight_loading(self, model, **kwargs: Any) -> None:
            qcfg: fmt.TritConfig = self.quantization_config.trit
            names = [n for n, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and is_decoder_linear(n) and qcfg.is_converted(n)]
            swap_linears(model, names, qcfg)
            files = kwargs.get("checkpoint_files") or []
            if files:  # before any weight is read: none is left to random initialisation, none goes unused
                check_state_names(model, Path(files[0]).parent)

        def _process_model_after_weight_loading(self, model, **kwargs: Any) -> None:
            qcfg: fmt.TritConfig = self.quantization_config.trit
            for name, mod in model.named_modules():
                if isinstance(mod, TritLinear):
                    for (packed, scale), suffixes in zip(mod.planes_tensors(), fmt.plane_suffixes(mod.planes)):
                        fmt.check_layer(name, packed, scale, qcfg.group_size, mod.out_features, mod.in_features,
                                        suffixes=suffixes)
            prepare(model, model.dtype)  # each layer's layout for inference (trit.linear), as trit.load does
            if int8_rows.head_choice(qcfg.lm_head) == "int8":  # the output layer as trit.load and vLLM serve it
                use_int8_head(model, "config.json")

        def param_element_size(self, model, param_name: str, param: torch.Tensor) -> float:
            return param.element_size()

        def is_serializable(self) -> bool:
            return False  # a trit checkpoint is written by trit (quantize, heal), not by save_pretrained

        @property
        def is_trainable(self) -> bool:
            return False

    return TritHfConfig, TritHfQuantizer


def check_state_names(model: torch.nn.Module, folder: Path) -> None:
    """Every tensor ``model`` (its ternary layers swapped in) needs is in the checkpoint at ``folder`` with its shape,
    and the checkpoint holds no other; one :class:`~trit.format.FormatError` naming the first that is not."""
    from trit.arch import tied_names
    from trit.checkpoint import open_checkpoint

    ckpt = open_checkpoint(folder)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(ckpt.tensors) - tied_names(model))
    if missing:
        raise fmt.FormatError(f"{folder}: {missing[0]}", f"a tensor in the checkpoint (the {type(model).__name__} "
                              "needs it)", "none")
    unknown = sorted(set(ckpt.tensors) - set(expected))
    if unknown:
        raise fmt.FormatError(f"{folder}: {unknown[0]}", f"a tensor of the {type(model).__name__}", "an unknown name")
    for name, info in ckpt.tensors.items():
        if tuple(info.shape) != expected[name]:
            raise fmt.FormatError(f"{folder}: {name}", f"shape {expected[name]}", str(tuple(info.shape)))


def register() -> None:
    """Teach transformers the ``trit`` quantization method; safe to call more than once."""
    global _registered
    if _registered:
        return
    from transformers.quantizers.auto import (
        AUTO_QUANTIZATION_CONFIG_MAPPING,
        AUTO_QUANTIZER_MAPPING,
        register_quantization_config,
        register_quantizer,
    )

    config_cls, quantizer_cls = _classes()
    if fmt.QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(fmt.QUANT_METHOD)(config_cls)
    if fmt.QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(fmt.QUANT_METHOD)(quantizer_cls)
    _registered = True
