"""Random Llama-family checkpoints made in memory: for tests, and for GPU checks where no model can be fetched.

:func:`make_checkpoint` saves a random causal LM of the given family (bf16
safetensors, optionally sharded) with a character-level tokenizer and a small
chat template, the smallest checkpoint every trit command and vLLM accept.
:func:`make_bitnet_checkpoint` saves a random natively ternary one in
transformers' ``bitnet`` format, packed by transformers' own ``pack_weights``.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def char_tokenizer():
    """A character-level fast tokenizer: ids 0-2 are <unk>, <s>, </s>, then printable ASCII."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    chars = sorted(set(string.printable) - {"\x0b", "\x0c"})
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_checkpoint(
    folder: str | Path,
    model_type: str = "llama",
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    shards: int = 1,
    seed: int = 0,
    tie: bool = False,
    std: float = 0.1,
) -> Path:
    """Save a random ``model_type`` causal LM with :func:`char_tokenizer`; returns the folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    tokenizer = char_tokenizer()
    config = AutoConfig.for_model(
        model_type, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=len(tokenizer),
        max_position_embeddings=1024, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        head_dim=hidden // heads,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():  # wider than the default init, so that outputs differ visibly
            p.normal_(0, std if p.dim() > 1 else 1.0)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    kw = {"max_shard_size": size // shards + 1} if shards > 1 else {}
    model.save_pretrained(folder, **kw)
    tokenizer.save_pretrained(folder)
    return folder


def make_bitnet_checkpoint(
    folder: str | Path,
    linear_class: str = "bitlinear",
    mode: str = "offline",
    model_type: str = "bitnet",
    seed: int = 0,
    **kwargs,
) -> Path:
    """Save a random BitNet b1.58 checkpoint as transformers writes one (``quant_method = "bitnet"``).

    The float model comes from :func:`make_checkpoint`; each decoder linear
    layer is made ternary per tensor (absmean, as BitNet trains) and, offline,
    packed with transformers' ``pack_weights`` beside a ``weight_scale`` in the
    convention of ``linear_class`` (``bitlinear`` stores the inverse scale).
    Online, the float weights stay as they are (the "master" variant).
    """
    import json

    from safetensors.torch import load_file, save_file
    from transformers.integrations.bitnet import pack_weights

    from trit.arch import is_decoder_linear

    folder = make_checkpoint(folder, model_type=model_type, seed=seed, **kwargs)
    path = folder / "model.safetensors"
    state = load_file(path)
    if mode == "offline":
        for name in [n for n in state if n.endswith(".weight") and is_decoder_linear(n[: -len(".weight")])]:
            w = state[name].float()
            inv = 1.0 / w.abs().mean().clamp(min=1e-5)  # values = round(w * inv), dequantized = values / inv
            values = (w * inv).round().clamp(-1, 1).to(torch.int8)
            state[name] = pack_weights(values.clone())  # (ceil(N / 4), K) uint8
            scale = inv if linear_class == "bitlinear" else 1.0 / inv
            state[name[: -len("weight")] + "weight_scale"] = scale.reshape(1).to(torch.bfloat16)
        save_file(state, path, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "bitnet", "linear_class": linear_class, "quantization_mode": mode,
        "modules_to_not_convert": None, "use_rms_norm": False,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
