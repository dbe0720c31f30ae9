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


def word_tokenizer(vocab_size: int):
    """A word-level fast tokenizer of ``vocab_size`` ids: 0-2 are <unk>, <s>, </s>, id i >= 3 the word ``t<i>``,
    words joined by spaces, so that any id sequence decodes and encodes back to itself.

    Each token's string holds its separating space (``▁t<i>``, as Llama's and GPT-2's tokens carry theirs), so that
    no text of n tokens is longer than n times the longest token. vLLM 0.25.1 refuses a prompt longer than that
    bound before it tokenizes it (its renderer's character check, over the context left after ``max_tokens``); with
    bare words and spaces between them, prompts of 7-character words went over it.

    For serving benchmarks on random weights: vLLM's random prompts are runs of consecutive ids from a random start,
    so two are the same prompt when their starts agree modulo the word ids. With a real model's vocabulary that is
    rare (2 of the 704 prompts of ``trit bench serve``'s five levels at ``--prompts-per-seq 2`` on Llama-3-8B's);
    with :func:`char_tokenizer`'s 98 word ids most prompts repeat and vLLM's prefix cache skips their prefill."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 4:
        raise ValueError(f"a word tokenizer needs at least 4 ids (3 special, 1 word), not {vocab_size}")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"\u2581t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(prepend_scheme="always", split=True)
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
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=_loaded_vocab(folder, model_type),
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


def _loaded_vocab(folder: Path, model_type: str) -> int:
    """How many ids :func:`char_tokenizer` has once loaded beside a ``model_type`` config: some families'
    tokenizer classes add their own special tokens (Qwen2's ``<|endoftext|>``), and the embedding must hold them."""
    import json

    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    char_tokenizer().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return len(AutoTokenizer.from_pretrained(folder))


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


def random_packed(shape: tuple[int, ...], device: str | torch.device,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniformly random valid packed codes ``shape`` uint8: each byte four codes in {0, 1, 2} (never 3)."""
    from trit import format as fmt

    digits = torch.tensor([[v // 3**i % 3 for i in range(fmt.CODES_PER_BYTE)] for v in range(3**fmt.CODES_PER_BYTE)])
    table = fmt.pack(digits - 1).reshape(-1).to(device)  # (81,) uint8: base-3 number -> packed byte
    return table[torch.randint(0, len(table), shape, device=device, generator=generator)]


def random_model(
    config, trit_config=None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
    seed: int = 0, std: float = 0.02, prepare: bool = True,
):
    """A transformers causal LM of ``config`` with random weights made on ``device``: no checkpoint, no float copy.

    With ``trit_config`` every decoder linear layer is a :class:`~trit.nn.TritLinear` holding random valid
    codes and scales of about ``std`` (the layout a converted checkpoint would have); without it the model
    is the plain float one. Norm weights are 1. For benchmarks of whole models at sizes no test could save.
    With ``prepare`` (the default) the ternary layers are then held as the loader holds them
    (:func:`trit.nn.prepare`: on CUDA, the mma layout where its rule wants it), so the model runs what a loaded
    one runs.
    """
    from torch import nn

    from trit.arch import is_decoder_linear, materialize_buffers, meta_model_from_config
    from trit.nn import swap_linears

    device = torch.device(device)
    model = meta_model_from_config(config, dtype)
    if trit_config is not None:
        names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and is_decoder_linear(n)]
        swap_linears(model, names, trit_config)
    gen = torch.Generator(device=device).manual_seed(seed)
    for mod in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(mod, kind).items():
                if t is None or not t.is_meta or name in mod._non_persistent_buffers_set:
                    continue
                if t.dtype == torch.uint8:
                    new = random_packed(tuple(t.shape), device, gen)
                elif name.startswith("weight_scale"):
                    new = torch.empty(t.shape, dtype=t.dtype, device=device).uniform_(0.5 * std, 1.5 * std,
                                                                                       generator=gen)
                elif t.dim() == 1 and name == "weight":  # a norm
                    new = torch.ones(t.shape, dtype=t.dtype, device=device)
                else:
                    new = torch.empty(t.shape, dtype=t.dtype, device=device).normal_(0, std, generator=gen)
                getattr(mod, kind)[name] = nn.Parameter(new, requires_grad=False) if kind == "_parameters" else new
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    materialize_buffers(model, device)
    if trit_config is not None and prepare:
        from trit.nn import prepare as prepare_layers

        prepare_layers(model, dtype)
    return model.eval()
