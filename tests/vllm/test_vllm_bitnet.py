"""An imported BitNet b1.58 checkpoint in vLLM (the plugin's out-of-tree ``BitNetForCausalLM``) agrees with the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_helpers import llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

from trit import runtime

# Both engines quantize activations to int8 per token in float32; a value that lands on a rounding
# boundary can round apart (different summation order upstream), which moves a log-prob by up to a
# few 1e-2 (measured here: 0.014). Everywhere else they agree to float32 rounding (median below).
LOGPROB_MAX_TOL = 0.1
LOGPROB_MEDIAN_TOL = 1e-4


@pytest.fixture(scope="module")
def bitnet_trit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trit.bitnet import import_bitnet
    from trit.synthetic import make_bitnet_checkpoint

    root = tmp_path_factory.mktemp("bitnet")
    src = make_bitnet_checkpoint(root / "src", hidden=128, intermediate=256, heads=2, kv_heads=1)
    import_bitnet(src, root / "trit", progress=False, log=lambda s: None)
    return root / "trit"


@pytest.fixture(scope="module")
def vllm_outputs(bitnet_trit: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return llm_outputs(bitnet_trit, tmp_path_factory.mktemp("vllm-bitnet") / "out.json")


def test_greedy_tokens_equal_the_runtime(vllm_outputs: list[dict], bitnet_trit: Path) -> None:
    loaded = runtime.load(bitnet_trit, device="cpu", dtype=torch.float32)
    assert type(loaded.model).__name__ == "BitNetForCausalLM"
    for r in vllm_outputs:
        assert r["greedy"] == runtime_greedy(loaded, r)


def test_prompt_logprobs_agree(vllm_outputs: list[dict], bitnet_trit: Path) -> None:
    loaded = runtime.load(bitnet_trit, device="cpu", dtype=torch.float32)
    d = torch.cat([logprob_diffs(loaded, r) for r in vllm_outputs])
    assert d.max().item() < LOGPROB_MAX_TOL
    assert d.median().item() < LOGPROB_MEDIAN_TOL
