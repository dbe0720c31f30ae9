"""The one layer object (:mod:`trit.linear`): which layout a layer is held in and why, repacking in place, the
forward it binds, warm-up."""

from __future__ import annotations

import pytest
import torch
from conftest import trit_mlp

from trit import format as fmt
from trit import linear
from trit.kernels.cuda import launch as cuda_launch

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def _why(spec: linear.LinearSpec, device: torch.device, dtype: torch.dtype) -> str:
    """The tiled layout's refusal or rule for this layer, as :func:`trit.linear.choose` explains it."""
    choice = linear.choose(spec, device, dtype)
    return dict(choice.refused).get("mma", "") if choice.kernel is linear.PackedLinear else ""


def test_the_choice_says_why_a_layer_stays_in_format_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = linear.LinearSpec(40, 576, 64)
    assert "cannot: the mma layout's kernels run on CUDA, not cpu" == _why(spec, CPU, torch.bfloat16)
    monkeypatch.setattr(cuda_launch, "unavailable", lambda: None)  # as on a GPU where NVRTC compiles
    assert "bf16" in _why(spec, CUDA, torch.float16)
    assert "group size 256" in _why(linear.LinearSpec(40, 576, 256), CUDA, torch.bfloat16)
    assert "multiple of 8" in _why(linear.LinearSpec(40, 580, 64), CUDA, torch.bfloat16)
    big = linear.LinearSpec(4096, 4096, 64)
    assert "format v1's Triton kernels are as fast" in _why(big, CUDA, torch.bfloat16)  # a rule, not a refusal
    assert not _why(big, CUDA, torch.bfloat16).startswith("cannot")
    # Llama-3-8B's qkv (24Mi weights) is over the line, int8 activations (W1.58A8) or not
    from trit.kernels.cuda import wgmma

    monkeypatch.setattr(wgmma, "supported", lambda device: "wgmma needs sm_90 (Hopper); this GPU is sm_89")
    for act_int8 in (False, True):
        qkv = linear.LinearSpec(6144, 4096, 64, 1, act_int8)
        assert linear.choose(qkv, CUDA, torch.bfloat16).kernel is linear.TiledLinear
    # W1.58A8 of one scale a row (BitNet's imports) on Hopper: tiled from 16Mi weights, for the int8 wgmma kernel
    llama_o = linear.LinearSpec(4096, 4096, fmt.PER_ROW, 1, True)
    assert "format v1's Triton kernels are as fast" in _why(llama_o, CUDA, torch.bfloat16)
    monkeypatch.setattr(wgmma, "supported", lambda device: None)
    assert linear.choose(llama_o, CUDA, torch.bfloat16).kernel is linear.TiledLinear
    assert "format v1's Triton kernels are as fast" in _why(linear.LinearSpec(2560, 2560, fmt.PER_ROW, 1, True),
                                                            CUDA, torch.bfloat16)  # BitNet 2B4T's o_proj
    # from 8Mi where the layer is wide: BitNet 2B4T's fused q/k/v (3840 x 2560), not Qwen2-1.5B's down (1536 x 8960)
    bitnet_qkv = linear.LinearSpec(3840, 2560, fmt.PER_ROW, 1, True)
    assert linear.choose(bitnet_qkv, CUDA, torch.bfloat16).kernel is linear.TiledLinear
    assert "format v1's Triton kernels are as fast" in _why(linear.LinearSpec(1536, 8960, fmt.PER_ROW, 1, True),
                                                            CUDA, torch.bfloat16)
    assert "format v1's Triton kernels are as fast" in _why(linear.LinearSpec(3840, 2560, 64, 1, True),
                                                            CUDA, torch.bfloat16)  # groups: the 20Mi line
    for g in (32, 64, 128):  # groups: the size rule of every layer (format v1 ran them faster below it)
        grouped = linear.LinearSpec(4096, 4096, g, 1, True)
        assert "format v1's Triton kernels are as fast" in _why(grouped, CUDA, torch.bfloat16), g
    # Qwen2-1.5B's gate_up (26Mi weights, K = 1536) is large enough but has too few inputs
    assert "K = 1536 < 2048" in _why(linear.LinearSpec(17920, 1536, 64), CUDA, torch.bfloat16)
    monkeypatch.setenv("TRIT_LAYOUT", "v1")
    assert _why(spec, CUDA, torch.bfloat16) == "cannot: TRIT_LAYOUT=v1"
    monkeypatch.setenv("TRIT_LAYOUT", "mma")  # forced: any device and dtype the layout can hold
    assert linear.choose(spec, CPU, torch.float32).kernel is linear.TiledLinear
    assert "group size 256" in _why(linear.LinearSpec(40, 576, 256), CPU, torch.float32)
    monkeypatch.setenv("TRIT_LAYOUT", "tiles")
    with pytest.raises(ValueError, match="TRIT_LAYOUT='tiles'"):
        linear.choose(spec, CUDA, torch.bfloat16)
    monkeypatch.delenv("TRIT_LAYOUT")
    assert linear.choose(spec, CPU, torch.float32).explain() == (
        "mma: cannot: the mma layout's kernels run on CUDA, not cpu\nv1: chosen")


def test_a_prepared_layer_computes_the_same_and_refuses_to_save(monkeypatch: pytest.MonkeyPatch) -> None:
    model = trit_mlp(96, 64, 32, torch.float32)
    x = torch.randn(3, 96)
    first = model[0]
    for layer in (model[0], model[2]):
        layer.weight_scale.copy_(layer.weight_scale.to(torch.bfloat16))  # the layout's scales are bf16
    want = model(x)
    monkeypatch.setenv("TRIT_LAYOUT", "mma")
    for layer in (model[0], model[2]):
        assert layer.prepare(torch.float32).kernel is linear.TiledLinear
    assert first.layout == "mma" and "layout=mma" in repr(first) and not hasattr(first, "weight_packed")
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="mma layout"):
        model.state_dict()
    with pytest.raises(RuntimeError, match="mma layout"):
        first.planes_tensors()
    with pytest.raises(RuntimeError, match="prepared already"):
        first.prepare(torch.float32)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)
    assert first.trit_kernel.warm_up(first, torch.float32, ms=(1, 5)) == 2


def test_a_layer_left_in_format_v1_keeps_its_buffers_and_state() -> None:
    model = trit_mlp(96, 64, 32, torch.float32)
    x = torch.randn(3, 96)
    want = model(x)
    choice = model[0].prepare(torch.float32)  # on the CPU, under auto: format v1
    assert choice.kernel is linear.PackedLinear and model[0].layout == "v1"
    assert "0.weight_packed" in model.state_dict()
    torch.testing.assert_close(model(x), want)


def test_vllm_style_parameters_stay_parameters_when_repacked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's layers hold parameters, the runtime's buffers: each kind is kept through the repack."""
    from conftest import seeded_layer

    monkeypatch.setenv("TRIT_LAYOUT", "mma")
    packed, scale = seeded_layer(40, 576, 64)
    layer = torch.nn.Module()
    layer.weight_packed = torch.nn.Parameter(packed, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
    spec = linear.LinearSpec(40, 576, 64)
    linear.prepare(layer, spec, CPU, torch.float32)
    assert isinstance(layer.tiles_0_codes, torch.nn.Parameter) and not hasattr(layer, "weight_packed")
    x = torch.randn(2, 576)
    want = torch.nn.functional.linear(x, fmt.dequantize(packed, scale.to(torch.bfloat16).float(), 576))
    torch.testing.assert_close(layer.trit_kernel.apply(layer, x), want, rtol=1e-5, atol=1e-5)


def test_warm_up_runs_each_size_once_a_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    import trit.ops

    model = trit_mlp(160, 24, 32, torch.float32)
    calls = []
    monkeypatch.setattr(trit.ops, "linear", lambda x, *a: calls.append(tuple(x.shape)) or x.new_zeros(x.shape[0], 24))
    first = model[0]
    assert first.trit_kernel.warm_up(first, torch.float32, ms=(1, 17)) == 2
    assert calls == [(1, 160), (17, 160)]
    assert first.trit_kernel.warm_up(first, torch.float32, ms=(1, 17)) == 0  # this shape is warm
    assert model[2].trit_kernel.warm_up(model[2], torch.float32, ms=(1, 17)) == 2  # another is not


def test_warm_up_wanted_follows_the_device_and_trit_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIT_WARMUP", raising=False)
    assert linear.warm_up_wanted(CUDA) and not linear.warm_up_wanted(CPU)
    monkeypatch.setenv("TRIT_WARMUP", "0")
    assert not linear.warm_up_wanted(CUDA)
    monkeypatch.setenv("TRIT_WARMUP", "1")
    assert linear.warm_up_wanted(CPU)


def test_warm_up_of_a_model_calls_the_real_op_on_every_plane() -> None:
    from transformers import AutoConfig

    from trit.nn import warm_up
    from trit.synthetic import random_model

    cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    model = random_model(cfg, fmt.TritConfig(group_size=32, planes=2), "cpu", torch.float32, seed=3)
    # distinct (in, out) shapes: q/o 64->64, k/v 64->32, gate/up 64->96, down 96->64; the layers of the second
    # decoder layer have the first's shapes, so they compile nothing new
    assert warm_up(model, torch.float32) == 4 * len(linear.WARM_UP_MS)
    assert warm_up(model, torch.float32) == 0
