"""The int8 lm_head in vLLM (``quantization_config.lm_head = "int8"``): the plugin's head method takes the output
layer, and tokens and log-probs equal the runtime's with the same int8 head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vllm_helpers import llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

from trit import runtime


@pytest.mark.parametrize("tie", [False, True])
def test_an_int8_head_in_vllm_equals_the_runtime(tmp_path: Path, tie: bool) -> None:
    from trit.configs import AbsmeanConfig, Layout
    from trit.convert import convert
    from trit.kernels.int8_rows import Int8RowsLinear
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1, tie=tie)
    convert(src, tmp_path / "trit", AbsmeanConfig(64), Layout(lm_head="int8"),
            progress=False, log=lambda s: None)
    assert json.loads((tmp_path / "trit" / "config.json").read_text())["quantization_config"]["lm_head"] == "int8"
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    assert set(json.loads((tmp_path / "out.json.head.json").read_text()).values()) == {"TritInt8HeadMethod"}
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    assert isinstance(loaded.model.get_output_embeddings(), Int8RowsLinear)
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
        assert logprob_diffs(loaded, r).max().item() < 1e-3


def test_each_head_layer_gets_its_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ParallelLMHead gets the head method; a plain embedding (the head itself of a tied Qwen2 on vLLM 0.25)
    the tied-embedding method; "stored" leaves both to vLLM."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    from trit import format as fmt
    from trit.vllm.config import TritInt8HeadMethod, TritInt8TiedEmbeddingMethod, TritVllmConfig

    head, embed = object.__new__(ParallelLMHead), object.__new__(VocabParallelEmbedding)  # no process group needed
    cfg = TritVllmConfig(fmt.TritConfig(lm_head="int8"))
    assert isinstance(cfg.get_quant_method(head, "lm_head"), TritInt8HeadMethod)
    assert isinstance(cfg.get_quant_method(embed, "model.embed_tokens"), TritInt8TiedEmbeddingMethod)
    stored = TritVllmConfig(fmt.TritConfig())
    assert stored.get_quant_method(head, "lm_head") is None and stored.get_quant_method(embed, "x") is None
    monkeypatch.setenv("TRIT_LM_HEAD", "stored")
    assert cfg.get_quant_method(head, "lm_head") is None


def test_a_tied_embedding_looks_up_floats_and_multiplies_int8_rows() -> None:
    from trit.kernels import int8_rows
    from trit.vllm.config import TritInt8TiedEmbeddingMethod

    method, layer = TritInt8TiedEmbeddingMethod(), torch.nn.Module()
    method.create_weights(layer, 64, [100], 64, 100, torch.float32)
    w = torch.randn(100, 64, generator=torch.Generator().manual_seed(0))
    layer.weight.data.copy_(w)
    method.process_weights_after_loading(layer)
    ids = torch.tensor([3, 99, 0])
    assert torch.equal(method.embedding(layer, ids), w[ids])  # the embedding as stored
    x = torch.randn(2, 64)
    torch.testing.assert_close(method.apply(layer, x), int8_rows.reference(x, *int8_rows.quantize_rows(w)))
    assert layer.trit_head_q.dtype == torch.int8 and torch.equal(layer.weight.data, w)  # rows beside, floats kept
