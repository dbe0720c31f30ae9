"""The plugin's mma-layout path in the real engine: with ``TRIT_LAYOUT=mma`` (forced, so that the CPU's
vLLM takes it) every ternary layer is repacked at load, ``apply`` calls ``trit::linear_tiled``, and the
outputs equal the runtime's with the same layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_helpers import llm_layers, llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

from trit import runtime


def test_the_mma_layout_in_vllm_equals_the_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trit.configs import AbsmeanConfig
    from trit.convert import convert
    from trit.nn import TritLinear
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1)
    convert(src, tmp_path / "trit", AbsmeanConfig(64), progress=False,
            log=lambda s: None)
    monkeypatch.setenv("TRIT_LAYOUT", "mma")  # the engine's subprocess inherits it
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    trit_layers = [layer for layer in llm_layers(tmp_path / "out.json") if layer["method"] == "TritLinearMethod"]
    assert trit_layers and all(layer["tiled"] for layer in trit_layers)
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    assert all(m.layout == "mma" for m in loaded.model.modules() if isinstance(m, TritLinear))
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
        assert logprob_diffs(loaded, r).max().item() < 1e-3
