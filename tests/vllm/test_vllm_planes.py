"""A two-plane (trit-planes) checkpoint in vLLM: the second plane loads and is summed, as in the runtime."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm_helpers import llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

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
