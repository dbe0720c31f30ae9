"""``trit quantize --scheme w4a8``: the compressed-tensors checkpoint it writes, read back by trit's runtime,
and the group sizes, flags and sources it refuses before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, trit
from safetensors.torch import load_file
from test_cli_bad_input import digest, left_behind, refused

from trit import compressed, runtime
from trit.nn import W4A8Linear

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def test_checkpoint_holds_int4_codes_scales_and_the_scheme(tiny_w4a8: Path) -> None:
    config = json.loads((tiny_w4a8 / "config.json").read_text())
    assert compressed.W4A8Scheme.from_dict(config["quantization_config"], "config") == compressed.W4A8Scheme(64)
    tensors = load_file(tiny_w4a8 / "model.safetensors")
    src = load_file(tiny_w4a8.parent / "float" / "model.safetensors")
    for layer in range(2):
        for name in LINEARS:
            key = f"model.layers.{layer}.{name}"
            w, s = tensors[f"{key}.weight"], tensors[f"{key}.weight_scale"]
            n, k = src[f"{key}.weight"].shape
            assert w.dtype == torch.int8 and w.shape == (n, k) and -8 <= int(w.min()) and int(w.max()) <= 7
            assert s.dtype == torch.bfloat16 and s.shape == (n, k // 64) and (s > 0).all()
            deq = (w.float().reshape(n, -1, 64) * s.float()[..., None]).reshape(n, k)
            f = src[f"{key}.weight"].float()
            assert (deq - f).norm() < 0.4 * f.norm()  # GPTQ trades weight error for output error
    for kept in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert torch.equal(tensors[kept], src[kept])


def test_rotate_writes_the_rotated_model_in_w4a8(tmp_path: Path) -> None:
    """``--scheme w4a8`` rotates by default: GPTQ rounds the rotated weights, the tied model gets the rotated lm_head the
    library computes and norms of ones, the source stays as it was, and the runtime's model tracks the float one
    (the rotation changes nothing in float)."""
    from trit.quant.rotate import make_rotation, rotate_tensor

    src = make_tiny_model(tmp_path / "float", tie=True, hidden=128, intermediate=256, heads=2, kv_heads=1)
    before = digest(src)
    out = tmp_path / "w4a8"
    proc = trit("quantize", src, out, "--scheme", "w4a8", "--group-size", "64", "--calib-samples", "8",
                "--calib-seq-len", "64", "--no-calib-cache", "--quiet")
    assert "kept in high precision: lm_head, model.embed_tokens" in proc.stdout and "rotated first" in proc.stdout
    assert digest(src) == before
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and compressed.is_w4a8(config["quantization_config"])
    tensors, source = load_file(out / "model.safetensors"), load_file(src / "model.safetensors")
    rot = make_rotation(json.loads((src / "config.json").read_text()), tied=True, seed=0)
    head = rotate_tensor(rot, "model.embed_tokens.weight", source["model.embed_tokens.weight"], source.__getitem__)
    assert torch.equal(tensors["lm_head.weight"], head["lm_head.weight"])
    assert torch.equal(tensors["model.norm.weight"], torch.ones_like(source["model.norm.weight"]))
    for layer in range(2):
        for name in LINEARS:
            key = f"model.layers.{layer}.{name}"
            w, s = tensors[f"{key}.weight"].float(), tensors[f"{key}.weight_scale"].float()
            n, k = w.shape
            deq = (w.reshape(n, -1, 64) * s[..., None]).reshape(n, k)
            f = source[f"{key}.weight"].float()
            rotated = rotate_tensor(rot, f"{key}.weight", f, source.__getitem__)[f"{key}.weight"]
            assert (deq - rotated).norm() < 0.4 * rotated.norm()  # the codes are the rotated weight's
            assert (deq - f).norm() > 0.8 * f.norm()  # not the source's
    ids = torch.randint(3, 60, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = runtime.load(src, device="cpu").model(ids).logits
        got = runtime.load(out, device="cpu").model(ids).logits
    err = float((ref - got).norm() / ref.norm())
    assert 0 < err < 0.5, err


def test_runtime_layers_compute_the_int8_per_token_reference(tiny_w4a8: Path) -> None:
    loaded = runtime.load(tiny_w4a8, device="cpu", dtype=torch.float32)
    lin = loaded.model.model.layers[0].mlp.down_proj
    assert isinstance(lin, W4A8Linear) and lin.groups == 320 // 64
    x = torch.randn(3, 5, 320) * torch.linspace(0.1, 4, 320)
    s = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x / s).clamp(-128, 127) * s  # int8 per token, symmetric
    w = lin.weight.float() * lin.weight_scale.float().repeat_interleave(64, dim=1)
    torch.testing.assert_close(lin(x), xq @ w.T, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(lin(x), x @ w.T, rtol=1e-3, atol=1e-3)  # the activations are rounded


def test_runtime_w4a8_tracks_the_float_model(tiny_w4a8: Path) -> None:
    ids = torch.randint(3, 60, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        f = runtime.load(tiny_w4a8.parent / "float", device="cpu").model(ids).logits
        q = runtime.load(tiny_w4a8, device="cpu").model(ids).logits
    err = float((f - q).norm() / f.norm())
    assert 0 < err < 0.5, err


def test_cli_writes_channel_wise_and_eval_reads_it(tiny_w4a8: Path, tmp_path: Path) -> None:
    out = tmp_path / "channel"
    proc = trit("quantize", tiny_w4a8.parent / "float", out, "--scheme", "w4a8", "--group-size", "channel",
                "--calib", "wikitext2", "--calib-samples", "4", "--calib-seq-len", "64", "--quiet")
    assert "W4A8 (channel-wise) layers: 14" in proc.stdout
    scheme = compressed.W4A8Scheme.from_dict(json.loads((out / "config.json").read_text())["quantization_config"], "")
    assert scheme.group_size == compressed.CHANNEL
    assert load_file(out / "model.safetensors")["model.layers.1.mlp.down_proj.weight_scale"].shape == (192, 1)
    proc = trit("eval", out, "--ppl", "wikitext2", "--max-windows", "1", "--seq-len", "64")
    assert "perplexity" in proc.stdout


def test_bad_group_size_is_refused_naming_the_layers(tiny_w4a8: Path, tmp_path: Path) -> None:
    src = tiny_w4a8.parent / "float"
    before = digest(src)
    proc = trit("quantize", src, tmp_path / "out", "--scheme", "w4a8", "--group-size", "128", check=False)
    refused(proc, "group size 128 does not fit 14 of 14 layers", "model.layers.0.mlp.gate_proj (K=192)",
            "sizes that fit every layer: 32, 64, channel")
    proc = trit("quantize", src, tmp_path / "out", "--scheme", "w4a8", "--tensor-parallel-size", "4", check=False)
    refused(proc, "--tensor-parallel-size 4", "o_proj (K=192, 48 a rank)")
    assert left_behind(tmp_path) == [] and digest(src) == before


@pytest.mark.parametrize("flag", [["--planes", "2"], ["--keep", "lm_head"], ["--method", "absmean"],
                                  ["--lm-head", "int8"]])
def test_ternary_only_flags_are_refused(tiny_w4a8: Path, tmp_path: Path, flag: list[str]) -> None:
    proc = trit("quantize", tiny_w4a8.parent / "float", tmp_path / "o", "--scheme", "w4a8", *flag, check=False)
    refused(proc, flag[0], "ternary only")
    assert left_behind(tmp_path) == []


def test_a_quantized_source_is_refused(tiny_w4a8: Path, tmp_path: Path) -> None:
    proc = trit("quantize", tiny_w4a8, tmp_path / "o", "--scheme", "w4a8", check=False)
    refused(proc, "already quantized (quant_method 'compressed-tensors')")


def test_runtime_refuses_codes_outside_int4(tiny_w4a8: Path, tmp_path: Path) -> None:
    import shutil

    from conftest import rewrite_tensors

    bad = tmp_path / "bad"
    shutil.copytree(tiny_w4a8, bad)
    rewrite_tensors(bad, lambda t: t["model.layers.1.self_attn.o_proj.weight"].view(-1).__setitem__(0, 9))
    proc = trit("eval", bad, "--max-windows", "1", "--seq-len", "32", check=False)
    refused(proc, "model.layers.1.self_attn.o_proj.weight", "int4 codes in -8..7")


def test_w4a8_source_with_hidden_not_a_multiple_of_the_group(tmp_path: Path) -> None:
    """The refusal comes before calibration: a model whose every K misses the group is refused in seconds."""
    src = make_tiny_model(tmp_path / "src", hidden=96, intermediate=160, heads=2, kv_heads=1)
    proc = trit("quantize", src, tmp_path / "out", "--scheme", "w4a8", "--group-size", "64", check=False)
    refused(proc, "does not fit 14 of 14 layers", "sizes that fit every layer: 32, channel")
