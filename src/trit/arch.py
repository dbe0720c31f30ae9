"""The model families trit converts and runs, and which of their layers are ternary.

The Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM) and BitNet b1.58
(Llama's layout plus a norm before ``o_proj`` and ``down_proj`` and a
squared-ReLU MLP) share one set of linear layer names:
``model.layers.{i}.self_attn.{q,k,v,o}_proj`` and
``model.layers.{i}.mlp.{gate,up,down}_proj``. Those seven linear layers per
decoder layer are what trit makes ternary; embeddings, norms and ``lm_head``
stay in high precision. :func:`linear_shapes` gives their sizes from
config.json alone; :func:`meta_model` builds the whole transformers model on
the meta device (sizes, no memory) for the commands that need every tensor's
name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trit import format as fmt
from trit.checkpoint import CONFIG_FILE, Checkpoint, CheckpointError, check_paths, open_checkpoint

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "bitnet")

_DECODER_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")


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


def linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(out_features, in_features)`` of every decoder linear layer, from a Llama-family config.json."""
    c = config.get("text_config", config)
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    inter = c["intermediate_size"]
    per_layer = {
        "self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
        "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter),
    }
    return {f"model.layers.{i}.{name}": shape for i in range(c["num_hidden_layers"]) for name, shape in per_layer.items()}


def kv_cache_bytes(config: Any, tokens: int, element_size: int = 4) -> int:
    """Bytes of the KV cache of ``tokens`` tokens (float32 by default), from a config.json dict or a
    transformers config (a multimodal one's text config)."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    c = c.get("text_config", c) if isinstance(c, dict) else c
    get = c.get if isinstance(c, dict) else lambda k, d=None: getattr(c, k, d)
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    return 2 * get("num_hidden_layers") * kv_heads * head_dim * element_size * tokens


def meta_model(ckpt: Checkpoint | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """The checkpoint's (or config folder's) transformers model built on the meta device: sizes, no memory."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(ckpt.path if isinstance(ckpt, Checkpoint) else ckpt)
    hf_config.quantization_config = None  # trit's layers are swapped in by hand, not by a transformers quantizer
    return meta_model_from_config(hf_config, dtype)


def meta_model_from_config(hf_config: Any, dtype: torch.dtype | None = None) -> nn.Module:
    """A transformers config's causal LM on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, **({"dtype": dtype} if dtype else {}))


def tied_names(model: nn.Module) -> set[str]:
    """State-dict names that share storage with another (``lm_head.weight`` under tied embeddings)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return set()
    out = model.get_output_embeddings()
    return {f"{n}.weight" for n, m in model.named_modules() if m is out and out is not None}


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors codes of the dtypes a float checkpoint's tensors take


def open_float_source(src: Path, out: Path, overwrite: bool) -> Checkpoint:
    """The checkpoint at ``src``, checked as a quantizer's input: paths that do not clash, a supported
    architecture, not quantized already (headers only; :func:`check_float_source` checks its tensors)."""
    check_paths(src, out, overwrite)
    ckpt = open_checkpoint(src)
    check_architecture(ckpt.config, str(src / CONFIG_FILE))
    if ckpt.quantization_config is not None:
        method = ckpt.quantization_config.get("quant_method", "unknown")
        hint = "; import it with `trit import`" if method == "bitnet" else "; give a float checkpoint"
        raise CheckpointError(src / CONFIG_FILE, f"already quantized (quant_method {method!r}){hint}")
    return ckpt


def check_float_source(ckpt: Checkpoint) -> None:
    """Refuse a float checkpoint that lacks a tensor its model needs, or holds one of the wrong shape or dtype.

    Names and shapes come from the model built on the meta device; a tied ``lm_head`` may be absent. Reads
    headers only.
    """
    model = meta_model(ckpt)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(ckpt.tensors) - tied_names(model))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(ckpt.path, f"tensor {missing[0]!r}{more} is missing: the {type(model).__name__} of "
                                         "config.json needs it")
    for name, info in ckpt.tensors.items():
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(info.shard, f"tensor {name!r}: expected a float dtype ({', '.join(FLOAT_DTYPES)}), "
                                              f"found {info.dtype}")
        if name in expected and info.shape != expected[name]:
            raise CheckpointError(info.shard, f"tensor {name!r}: expected shape {expected[name]} from config.json, "
                                              f"found {info.shape}")


def materialize_buffers(model: nn.Module, device: torch.device) -> None:
    """Rebuild modules whose computed (non-persistent) buffers are still on the meta device (rotary tables)."""
    for name, mod in list(model.named_modules()):
        if not any(b.is_meta for b in mod.buffers(recurse=False)):
            continue
        if not hasattr(mod, "config"):
            raise RuntimeError(f"{name}: buffer left on the meta device and no config to rebuild it from")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, type(mod)(mod.config).to(device))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise fmt.FormatError(left[0], "a tensor in the checkpoint", "none")


def load_tokenizer(ckpt: Checkpoint):
    """The checkpoint folder's tokenizer (transformers'), whose vocabulary fits the model's embedding; else one
    :class:`CheckpointError` naming the folder."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    except (OSError, ValueError, TypeError) as e:  # no tokenizer files, or ones transformers cannot read
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(ckpt.path, f"expected a tokenizer (tokenizer.json or tokenizer.model with "
                                         f"tokenizer_config.json), found none transformers can load ({reason})") from None
    check_vocab(ckpt, len(tokenizer))
    return tokenizer


def check_vocab(ckpt: Checkpoint, tokenizer_size: int | None = None) -> None:
    """config.json's ``vocab_size`` equals the embedding's rows, and a tokenizer of ``tokenizer_size`` ids fits
    them; else one :class:`CheckpointError` naming the file and the sizes."""
    info = ckpt.tensors.get("model.embed_tokens.weight")
    if info is None:
        return  # the name checks report a missing embedding
    rows = info.shape[0]
    vocab = ckpt.config.get("vocab_size")
    if vocab is not None and vocab != rows:
        raise CheckpointError(ckpt.path / CONFIG_FILE, f"vocab_size {vocab}: expected the embedding's {rows} rows "
                                                       "(model.embed_tokens.weight)")
    if tokenizer_size is not None and tokenizer_size > rows:
        raise CheckpointError(ckpt.path, f"the tokenizer's {tokenizer_size} ids: expected at most the embedding's "
                                         f"{rows} rows")
