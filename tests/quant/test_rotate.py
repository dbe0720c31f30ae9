"""The residual-stream rotation: orthogonal factors, the same function after it, and ``trit quantize --rotate``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, trit
from safetensors import safe_open

from trit.checkpoint import open_checkpoint
from trit.quant.rotate import hadamard, make_rotation, rotate_tensor, rotated_config, structured_orthogonal


def _eye(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 2, 64, 576, 1536, 4096])
def test_factors_are_orthogonal(n: int) -> None:
    q = structured_orthogonal(n, torch.Generator().manual_seed(0))
    assert torch.allclose(q @ q.T, _eye(n), atol=1e-12)
    if n & (n - 1) == 0:
        h = hadamard(n)
        assert torch.allclose(h @ h.T, _eye(n), atol=1e-12)
        assert torch.allclose(h.abs() * n**0.5, torch.ones(n, n, dtype=torch.float64))


def test_hadamard_refuses_an_order_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two, not 12"):
        hadamard(12)


def _source_tensors(folder: Path) -> dict[str, torch.Tensor]:
    ckpt = open_checkpoint(folder)
    out = {}
    for shard in ckpt.shards:
        with safe_open(str(shard), "pt") as f:
            out |= {name: f.get_tensor(name).double() for name in f.keys()}  # noqa: SIM118
    return out


def _logits(folder_or_config, state=None) -> torch.Tensor:
    from transformers import AutoConfig, AutoModelForCausalLM

    if state is None:
        model = AutoModelForCausalLM.from_pretrained(folder_or_config, dtype=torch.float64)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**folder_or_config), dtype=torch.float64)
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"} - set(state)
    ids = torch.randint(3, 90, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(("model_type", "tie"), [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", False),
                                                 ("mistral", False)])
def test_rotated_model_is_the_same_function(tmp_path: Path, model_type: str, tie: bool) -> None:
    """Every tensor rotated (norms folded, a tied head made the model's own): the same logits, in float64.
    Qwen2 brings q/k/v biases, Qwen3 its q/k norms; the synthetic norms' weights are random, not ones."""
    src = make_tiny_model(tmp_path / "src", model_type=model_type, tie=tie, hidden=96, heads=6, kv_heads=2)
    config = json.loads((src / "config.json").read_text())
    tensors = _source_tensors(src)
    rot = make_rotation(config, tied="lm_head.weight" not in tensors, seed=3)
    assert rot.tied == tie
    rotated = {}
    for name, t in tensors.items():
        rotated |= rotate_tensor(rot, name, t, tensors.__getitem__)
    assert "lm_head.weight" in rotated
    assert all(torch.equal(t, torch.ones_like(t)) for n, t in rotated.items() if n.endswith("layernorm.weight"))
    assert not torch.allclose(rotated["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    new_config = rotated_config(config)
    assert new_config["tie_word_embeddings"] is False and config.get("tie_word_embeddings") == tie
    want, got = _logits(src), _logits(new_config, rotated)
    # HF's RMSNorm works in float32 whatever the dtype: agreement to float32's rounding, not float64's
    assert (got - want).abs().max() < 1e-5 * want.abs().max()


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_quantize_rotate_writes_an_untied_rotated_checkpoint(tmp_path: Path) -> None:
    """``trit quantize --rotate`` on a tied model: its own lm_head (the rotated head the library computes), norms
    of ones, the rotation recorded, the source untouched; the runtime loads it and runs it."""
    from trit import runtime

    src = make_tiny_model(tmp_path / "src", tie=True, hidden=128, intermediate=256, heads=4, kv_heads=2)
    before = _digest(src)
    out = tmp_path / "out"
    trit("quantize", src, out, "--rotate", "--group-size", "32", "--calib-samples", "4", "--calib-seq-len", "32",
         "--calib-batch", "4", "--no-calib-cache", "--device", "cpu", "--quiet")
    assert _digest(src) == before
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert config["quantization_config"]["rotation"] == {"seed": 0}
    stored = _source_tensors(out)
    source = _source_tensors(src)
    rot = make_rotation(json.loads((src / "config.json").read_text()), tied=True, seed=0)
    head = rotate_tensor(rot, "model.embed_tokens.weight", source["model.embed_tokens.weight"].bfloat16(),
                         source.__getitem__)
    assert torch.equal(stored["lm_head.weight"], head["lm_head.weight"].double())
    assert torch.equal(stored["model.embed_tokens.weight"], head["model.embed_tokens.weight"].double())
    assert torch.equal(stored["model.norm.weight"], torch.ones_like(stored["model.norm.weight"]))
    model = runtime.load(out, device="cpu", dtype=torch.float32)
    ids = torch.randint(3, 90, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.model(ids).logits
    assert logits.shape == (1, 16, config["vocab_size"]) and torch.isfinite(logits).all()


def test_rotation_is_the_default_for_gptq_only() -> None:
    from trit.configs import AbsmeanConfig, GPTQConfig, TWNConfig

    assert GPTQConfig().rotates and GPTQConfig(planes=2).rotates
    assert not AbsmeanConfig().rotates and not TWNConfig().rotates
    assert AbsmeanConfig(rotate=True).rotates
    assert not GPTQConfig(rotate=False).rotates
    from trit.configs import W4A8Config

    assert W4A8Config().rotates and not W4A8Config(rotate=False).rotates  # w4a8: on unless --no-rotate


def _tied_source() -> tuple[dict, dict[str, torch.Tensor]]:
    config = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96}
    gen = torch.Generator().manual_seed(1)
    tensors = {"model.embed_tokens.weight": torch.randn(37, 64, generator=gen).bfloat16(),
               "model.norm.weight": (torch.rand(64, generator=gen) + 0.5).bfloat16(),
               "model.layers.0.input_layernorm.weight": (torch.rand(64, generator=gen) + 0.5).bfloat16(),
               "model.layers.0.self_attn.v_proj.weight": torch.randn(64, 64, generator=gen),
               "model.layers.0.self_attn.v_proj.bias": torch.randn(64, generator=gen),
               "model.layers.0.self_attn.q_norm.weight": torch.rand(16, generator=gen),  # per head: untouched
               "model.layers.0.self_attn.o_proj.weight": torch.randn(64, 64, generator=gen),
               "model.layers.0.mlp.down_proj.weight": torch.randn(64, 96, generator=gen),
               "lm_head.weight": torch.randn(37, 64, generator=gen).bfloat16()}  # as an untied model's
    return config, tensors


def test_embeddings_are_rotated_in_row_blocks_and_the_head_only_when_asked(monkeypatch) -> None:
    import trit.quant.rotate as rotate

    config, src = _tied_source()
    rot = make_rotation(config, tied=True, seed=0)
    whole = rotate_tensor(rot, "model.embed_tokens.weight", src["model.embed_tokens.weight"], src.__getitem__)
    # the plain product, as the docstring defines it: E Q and E diag(g) Q in float64, then the source's dtype
    e, g = src["model.embed_tokens.weight"].double(), src["model.norm.weight"].double()
    assert torch.equal(whole["model.embed_tokens.weight"], (e @ rot.residual).bfloat16())
    assert torch.equal(whole["lm_head.weight"], ((e * g) @ rot.residual).bfloat16())
    monkeypatch.setattr(rotate, "_ROWS", 5)  # 37 rows: seven blocks and a short one
    blocks = rotate_tensor(rot, "model.embed_tokens.weight", src["model.embed_tokens.weight"], src.__getitem__)
    assert blocks.keys() == whole.keys() and all(torch.equal(blocks[k], whole[k]) for k in whole)
    alone = rotate_tensor(rot, "model.embed_tokens.weight", src["model.embed_tokens.weight"], src.__getitem__,
                          head=False)
    assert list(alone) == ["model.embed_tokens.weight"]
    assert torch.equal(alone["model.embed_tokens.weight"], whole["model.embed_tokens.weight"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_rotation_on_the_gpu_equals_the_cpu_and_returns_tensors_where_they_were() -> None:
    config, src = _tied_source()
    rot = make_rotation(config, tied=True, seed=0)
    on_gpu = rot.to("cuda")
    for name, tensor in src.items():
        cpu = rotate_tensor(rot, name, tensor, src.__getitem__)
        for where in ("cpu", "cuda"):  # a CPU tensor (the writer's) and one already on the GPU (the loader's)
            gpu = rotate_tensor(on_gpu, name, tensor.to(where), src.__getitem__)
            assert gpu.keys() == cpu.keys()
            for k in cpu:
                assert gpu[k].device.type == where and gpu[k].dtype == cpu[k].dtype
                torch.testing.assert_close(gpu[k].cpu().double(), cpu[k].double(), rtol=1e-6, atol=1e-6)
