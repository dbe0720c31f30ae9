"""A two-plane (trit-planes) checkpoint in vLLM: the second plane loads and is summed, as in the runtime."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from vllm_helpers import run_llm_script  # noqa: I001

from trit import runtime


def test_two_planes_in_vllm_equal_the_runtime(tmp_path: Path) -> None:
    from trit.convert import ConvertOptions, convert
    from trit.synthetic import make_checkpoint

    src = make_checkpoint(tmp_path / "float", hidden=128, intermediate=256, heads=2, kv_heads=1)
    convert(src, tmp_path / "trit", ConvertOptions(group_size=64, planes=2), progress=False, log=lambda s: None)
    proc = run_llm_script(tmp_path / "trit", tmp_path / "out.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    for r in json.loads((tmp_path / "out.json").read_text()):
        ids = torch.tensor([r["prompt_ids"]])
        assert r["greedy"] == runtime.greedy_ids(loaded, ids, len(r["greedy"]))[0].tolist()
        with torch.inference_mode():
            logp = torch.log_softmax(loaded.model(ids).logits[0].float(), -1)
        ours = logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
        assert (ours - torch.tensor(r["prompt_logprobs"][1:])).abs().max().item() < 1e-3
