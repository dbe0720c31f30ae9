"""``LLM(model=CKPT)`` on the ternary SmolLM2 agrees with trit's own runtime; bad checkpoints fail clearly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import corrupt_config, rewrite_tensors
from vllm_helpers import llm_outputs, logprob_diffs, run_llm_script, runtime_greedy  # noqa: I001

from trit import runtime

# Both engines compute in float32 here; they differ only in kernels and summation order (attention,
# matmul blocking), which moves a log-prob by about 1e-5 (measured: at most 2.1e-5 on this prompt set).
# 1e-3 nats leaves room for that and is still ten times tighter than bf16 rounding would allow.
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def vllm_outputs(smollm2_trit: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return llm_outputs(smollm2_trit, tmp_path_factory.mktemp("vllm") / "out.json")


def test_greedy_tokens_equal_the_runtime(vllm_outputs: list[dict], smollm2_trit: Path) -> None:
    loaded = runtime.load(smollm2_trit, device="cpu", dtype=torch.float32)
    for r in vllm_outputs:
        assert r["greedy"] == runtime_greedy(loaded, r)


def test_prompt_logprobs_agree(vllm_outputs: list[dict], smollm2_trit: Path) -> None:
    loaded = runtime.load(smollm2_trit, device="cpu", dtype=torch.float32)
    for r in vllm_outputs:
        assert logprob_diffs(loaded, r).max().item() < LOGPROB_TOL


@pytest.fixture
def broken(smollm2_trit: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(smollm2_trit, tmp_path / "broken"))


def test_format_version_2_fails_with_trit_message(broken: Path, tmp_path: Path) -> None:
    corrupt_config(broken, format_version=2)
    proc = run_llm_script(broken, tmp_path / "o.json")
    assert proc.returncode != 0
    assert "format_version: expected 1 (this trit reads format 1 only), found 2" in proc.stderr


def test_corrupt_codes_fail_with_trit_message(broken: Path, tmp_path: Path) -> None:
    rewrite_tensors(broken, lambda t: t["model.layers.3.mlp.up_proj.weight_packed"].view(-1)[:2].fill_(0xFF))
    proc = run_llm_script(broken, tmp_path / "o.json")
    assert proc.returncode != 0
    assert "model.layers.3.mlp.gate_up_proj.weight_packed: expected 2-bit codes in {0, 1, 2}, found 8 codes equal to 3" in proc.stderr


def test_negative_scales_fail_with_trit_message(broken: Path, tmp_path: Path) -> None:
    # a real load checks the scales as loaded (only a layer no tensor reached, under load_format=dummy, is mended)
    rewrite_tensors(broken, lambda t: t["model.layers.2.self_attn.o_proj.weight_scale"].view(-1)[:3].neg_())
    proc = run_llm_script(broken, tmp_path / "o.json")
    assert proc.returncode != 0
    assert "model.layers.2.self_attn.o_proj.weight_scale: expected positive scales, found 3 zero or negative" in proc.stderr


def test_wrong_scale_shape_fails_before_loading(broken: Path, tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.o_proj.weight_scale"
    rewrite_tensors(broken, lambda t: t.__setitem__(name, t[name][:, :4].clone()))
    proc = run_llm_script(broken, tmp_path / "o.json")
    assert proc.returncode != 0
    assert f"{name}: expected shape (576, 9) (group size 64), found (576, 4)" in proc.stderr
