"""Random Llama-family checkpoints made in memory: for tests, and for GPU checks where no model can be fetched.

:func:`make_checkpoint` saves a random causal LM of the given family (bf16
safetensors, optionally sharded) with a character-level tokenizer and a small
chat template, the smallest checkpoint every trit command and vLLM accept.
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
