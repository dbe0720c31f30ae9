"""The model families trit converts and runs, and which of their layers are ternary.

The Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM) and BitNet b1.58
(Llama's layout plus a norm before ``o_proj`` and ``down_proj`` and a
squared-ReLU MLP) share one set of linear layer names:
``model.layers.{i}.self_attn.{q,k,v,o}_proj`` and
``model.layers.{i}.mlp.{gate,up,down}_proj``. Those seven linear layers per
decoder layer are what trit makes ternary; embeddings, norms and ``lm_head``
stay in high precision.
"""

from __future__ import annotations

import re
from typing import Any

from trit.checkpoint import CheckpointError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "bitnet")

_DECODER_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")
_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def check_architecture(config: dict[str, Any], where: str) -> str:
    """Return the config's ``model_type`` if trit supports it, else raise naming the architecture."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = config.get("architectures") or [model_type]
        raise CheckpointError(
            where,
            f"unsupported architecture {', '.join(map(str, archs))} (model_type {model_type!r}); "
            f"trit supports model_type {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    return model_type


def is_decoder_linear(module: str) -> bool:
    """True for the seven linear layers of a decoder layer (``model.layers.3.mlp.up_proj``)."""
    return bool(_DECODER_LINEAR.match(module))


def layer_index(module: str) -> int | None:
    m = _LAYER_INDEX.match(module)
    return int(m.group(1)) if m else None
