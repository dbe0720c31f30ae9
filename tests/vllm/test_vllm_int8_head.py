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
    from trit.convert import ConvertOptions, convert
    from trit.kernels.int8_rows import Int8RowsLinear
    from trit.quant import Method
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1, tie=tie)
    convert(src, tmp_path / "trit", ConvertOptions(method=Method.ABSMEAN, group_size=64, lm_head="int8"),
            progress=False, log=lambda s: None)
    assert json.loads((tmp_path / "trit" / "config.json").read_text())["quantization_config"]["lm_head"] == "int8"
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    assert set(json.loads((tmp_path / "out.json.head.json").read_text()).values()) == {"TritInt8HeadMethod"}
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    assert isinstance(loaded.model.get_output_embeddings(), Int8RowsLinear)
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
        assert logprob_diffs(loaded, r).max().item() < 1e-3
