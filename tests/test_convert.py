"""The converter on tiny random Llama and Qwen2 models made here, and on each bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, rewrite_tensors
from safetensors import safe_open

from trit import format as fmt
from trit.checkpoint import CheckpointError, open_checkpoint
from trit.configs import AbsmeanConfig, GPTQConfig, Layout, TWNConfig
from trit.convert import ConvertError, convert
from trit.quant import DATA_FREE, Method, quantize


def _left_behind(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("method", DATA_FREE)
def test_converts_llama_family(tmp_path: Path, model_type: str, method: Method) -> None:
    src = make_tiny_model(tmp_path / "src", model_type=model_type, shards=2)
    report = convert(src, tmp_path / "out", {Method.ABSMEAN: AbsmeanConfig, Method.TWN: TWNConfig}[method](32) if method is not Method.GPTQ else GPTQConfig(32), progress=False)
    out = open_checkpoint(tmp_path / "out")
    layers = fmt.layer_names(out.tensors)
    assert len(layers) == 2 * 7 and report.ternary_weights > 0
    assert len(out.shards) == len(open_checkpoint(src).shards)
    qcfg = fmt.TritConfig.from_dict(out.config["quantization_config"])
    assert qcfg.group_size == 32 and qcfg.method == method.value
    assert {"lm_head", "model.embed_tokens"} <= set(qcfg.modules_not_converted)
    # the stored codes and scales are exactly the quantizer's output
    layer = "model.layers.1.self_attn.q_proj"
    with safe_open(str(open_checkpoint(src).tensors[f"{layer}.weight"].shard), "pt") as f:
        w = f.get_tensor(f"{layer}.weight")
    t = quantize(w.float(), 32, method)
    with safe_open(str(out.tensors[f"{layer}.weight_packed"].shard), "pt") as f:
        assert torch.equal(f.get_tensor(f"{layer}.weight_packed"), fmt.pack(t.values))
        assert torch.equal(f.get_tensor(f"{layer}.weight_scale"), t.scales.half())
    if model_type == "qwen2":  # biases stay beside the codes
        assert f"{layer}.bias" in out.tensors
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert report.bits_per_weight == pytest.approx(2 + 16 / 32)


def test_pads_or_keeps_odd_k(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "src", hidden=96, intermediate=128, heads=4, kv_heads=2)  # K = 96 or 128
    padded = convert(src, tmp_path / "pad", AbsmeanConfig(64), progress=False)
    actions = {r.name.rsplit(".", 1)[1]: r.action for r in padded.layers}
    assert actions["down_proj"] == "ternary" and actions["up_proj"] == actions["q_proj"] == "padded"
    ckpt = open_checkpoint(tmp_path / "pad")
    assert ckpt.tensors["model.layers.0.mlp.up_proj.weight_packed"].shape == (128, 128 // 4)
    assert ckpt.tensors["model.layers.0.mlp.up_proj.weight_scale"].shape == (128, 2)
    assert "K=96 padded to 128 with zero weights" in padded.summary()
    kept = convert(src, tmp_path / "keep", AbsmeanConfig(64), Layout(pad_policy=fmt.PadPolicy.KEEP),
                   progress=False)
    actions = {r.name.rsplit(".", 1)[1]: r.action for r in kept.layers}
    assert actions["down_proj"] == "ternary" and actions["up_proj"] == actions["q_proj"] == "kept"
    assert "K=96 is not a multiple of group 64; --pad keep" in kept.summary()
    cfg = json.loads((tmp_path / "keep" / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.self_attn.q_proj" in cfg["modules_not_converted"]


def test_refuses_when_nothing_is_left(tmp_path: Path, tiny_llama: Path) -> None:
    with pytest.raises(ConvertError, match="no linear layer left to quantize"):
        convert(tiny_llama, tmp_path / "o", GPTQConfig(), Layout(keep=("model.layers.*",)), progress=False)
    assert not (tmp_path / "o").exists()


def test_keep_patterns(tmp_path: Path, tiny_llama: Path) -> None:
    r = convert(tiny_llama, tmp_path / "o", AbsmeanConfig(32), Layout(keep=("*.down_proj", "model.layers.0.self_attn.q_proj")),
                progress=False)
    kept = sorted(x.name for x in r.layers if x.action == "kept")
    assert kept == ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert set(kept) <= set(cfg["modules_not_converted"])
    assert "model.layers.1.mlp.down_proj.weight" in open_checkpoint(tmp_path / "o").tensors


def test_refuses_unmatched_keep(tmp_path: Path, tiny_llama: Path) -> None:
    with pytest.raises(ConvertError, match="--keep no_such_layer: matches no module"):
        convert(tiny_llama, tmp_path / "o", GPTQConfig(), Layout(keep=("no_such_layer",)), progress=False)
    assert not (tmp_path / "o").exists()


def test_refuses_out_equal_to_model(tiny_llama: Path) -> None:
    before = sorted(p.name for p in tiny_llama.iterdir())
    with pytest.raises(ConvertError, match="is MODEL_DIR"):
        convert(tiny_llama, tiny_llama, overwrite=True, progress=False)
    with pytest.raises(ConvertError, match="inside MODEL_DIR"):
        convert(tiny_llama, tiny_llama / "sub", progress=False)
    with pytest.raises(ConvertError, match="would delete the source"):
        convert(tiny_llama, tiny_llama.parent, overwrite=True, progress=False)
    assert sorted(p.name for p in tiny_llama.iterdir()) == before


def test_refuses_non_empty_out_without_overwrite(tmp_path: Path, tiny_llama: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="not empty; pass --overwrite"):
        convert(tiny_llama, out, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    convert(tiny_llama, out, AbsmeanConfig(32), overwrite=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert _left_behind(tmp_path) == []


def test_nan_tensor_leaves_nothing(tmp_path: Path, tiny_llama: Path) -> None:
    rewrite_tensors(tiny_llama, lambda t: t["model.layers.1.mlp.up_proj.weight"].view(-1).__setitem__(5, float("nan")))
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' holds 1 NaN or Inf"):
        convert(tiny_llama, tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists() and _left_behind(tmp_path) == []


def test_inf_in_float_tensor(tmp_path: Path, tiny_llama: Path) -> None:
    rewrite_tensors(tiny_llama, lambda t: t["model.norm.weight"].__setitem__(0, float("inf")))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' holds 1 NaN or Inf"):
        convert(tiny_llama, tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_unsupported_architecture(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    src = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(src)
    with pytest.raises(CheckpointError, match=r"unsupported architecture GPT2LMHeadModel .*model_type 'gpt2'"):
        convert(src, tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_refuses_already_quantized(tmp_path: Path, tiny_llama_trit: Path) -> None:
    with pytest.raises(CheckpointError, match="already quantized"):
        convert(tiny_llama_trit, tmp_path / "o", progress=False)


def test_interrupt_leaves_nothing(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trit.convert as conv

    calls = {"n": 0}
    real = conv.quantize

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(conv, "quantize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_llama, tmp_path / "o", AbsmeanConfig(32), progress=False)
    assert not (tmp_path / "o").exists() and _left_behind(tmp_path) == []
