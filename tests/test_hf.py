"""transformers' own ``from_pretrained`` on trit checkpoints, after ``import trit``."""

from __future__ import annotations

from pathlib import Path

import torch

import trit  # noqa: F401  (registers the quantizer)
from trit import runtime
from trit.nn import TritLinear


def test_from_pretrained_equals_the_runtime(tiny_llama_trit: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_trit, dtype=torch.float32)
    layer = model.model.layers[0].mlp.up_proj
    assert isinstance(layer, TritLinear) and layer.weight_scale.dtype == torch.float16  # scales as stored
    loaded = runtime.load(tiny_llama_trit, device="cpu", dtype=torch.float32)
    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, loaded.model(ids).logits)


def test_from_pretrained_serves_the_int8_head_as_the_runtime_does(tiny_llama_trit: Path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    from trit.kernels.int8_rows import Int8RowsLinear

    monkeypatch.setenv("TRIT_LM_HEAD", "int8")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_trit, dtype=torch.float32)
    loaded = runtime.load(tiny_llama_trit, device="cpu", dtype=torch.float32)
    assert isinstance(model.get_output_embeddings(), Int8RowsLinear)
    ids = torch.tensor([[1, 5, 9, 20, 3]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, loaded.model(ids).logits, rtol=1e-5, atol=1e-5)


def test_real_smollm2_through_transformers_pipeline(smollm2_trit: Path) -> None:
    """A tool built on transformers alone (its text-generation pipeline) runs a trit checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(smollm2_trit, dtype=torch.float32)
    assert sum(isinstance(m, TritLinear) for m in model.modules()) == 30 * 7
    generate = pipeline("text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(smollm2_trit))
    out = generate("The capital of France is", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert out.startswith("The capital of France is") and len(out) > len("The capital of France is")
    loaded = runtime.load(smollm2_trit, device="cpu", dtype=torch.float32)
    ids = loaded.tokenizer("Hello there", return_tensors="pt").input_ids
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, loaded.model(ids).logits, rtol=0, atol=0)
