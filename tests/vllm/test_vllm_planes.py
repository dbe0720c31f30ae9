"""Trit-planes in vLLM: a second plane loads and is summed, as in the runtime, in every layer or in the layers a
bits budget chose."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm_helpers import llm_layers, llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

from trit import format as fmt
from trit import runtime


def test_two_planes_in_vllm_equal_the_runtime(tmp_path: Path) -> None:
    from trit.configs import TWNConfig
    from trit.convert import convert
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1)
    convert(src, tmp_path / "trit", TWNConfig(64, planes=2), progress=False, log=lambda s: None)
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
        assert logprob_diffs(loaded, r).max().item() < 1e-3


def test_a_bits_budget_checkpoint_in_vllm_equals_the_runtime(tmp_path: Path) -> None:
    import json

    from trit.configs import CalibConfig, GPTQConfig
    from trit.convert import convert
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1, std=0.05)
    text = tmp_path / "calib.txt"
    text.write_text("The ternary weights were packed four to a byte. A layer reads its inputs once per token. " * 40)
    config = GPTQConfig(64, calib=CalibConfig(text, samples=4, seq_len=64, batch=4), bits=3.0)
    convert(src, tmp_path / "trit", config, progress=False, log=lambda s: None)
    qcfg = fmt.TritConfig.from_dict(json.loads((tmp_path / "trit" / "config.json").read_text())["quantization_config"])
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    # each layer vLLM built (qkv_proj, gate_up_proj fused) holds the planes the checkpoint gives its parts
    served = {layer["name"]: layer["planes"] for layer in llm_layers(tmp_path / "out.json") if layer["planes"]}
    assert served == {name: qcfg.planes_of(name) for name in served} and set(served.values()) == {1, 2}
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
        assert logprob_diffs(loaded, r).max().item() < 1e-3
