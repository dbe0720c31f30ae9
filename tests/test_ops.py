"""``trit::linear`` and ``trit::linear_tiled`` on the CPU: int8 activations, gradients, the fake implementations,
layers repacked into the mma layout."""

from __future__ import annotations

import torch
from conftest import seeded_layer, trit_mlp

from trit import format as fmt
from trit import ops
from trit.kernels import reference


def test_int8_activations_quantize_per_token() -> None:
    x = torch.randn(4, 100) * torch.tensor([[1.0], [10.0], [0.0], [1e-3]])
    q, s = reference.quantize_activations_int8(x)
    assert q.dtype == torch.int8 and s.shape == (4, 1)
    assert q[[0, 1, 3]].abs().amax(-1).tolist() == [127, 127, 127]  # each row's largest value maps to 127
    assert (q[2] == 0).all() and s[2, 0] == 127 / 1e-5  # a zero row: the floor, all codes zero
    assert ((q.float() / s - x).abs() <= 0.5 / s + 1e-7).all()  # within half a step of its row's grid


def test_op_with_int8_activations_equals_reference() -> None:
    packed, scale = seeded_layer(40, 576, 64)
    x, b = torch.randn(3, 576), torch.randn(40)
    y = torch.ops.trit.linear(x, packed, scale, 64, b, True)  # the CPU kernel, on x_q / s
    want = reference.linear_a8(x, packed, scale, 64, b)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    plain = torch.ops.trit.linear(x, packed, scale, 64, b)
    assert (plain - want).abs().max() > 1e-4  # the flag changes the arithmetic: it is not ignored


def test_gradients_flow_to_activations_and_bias() -> None:
    packed, scale = seeded_layer(40, 96, 32)
    x = torch.randn(5, 96, requires_grad=True)
    b = torch.randn(40, requires_grad=True)
    torch.ops.trit.linear(x, packed, scale, 32, b).square().sum().backward()
    w = fmt.dequantize(packed, scale, 96)
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.nn.functional.linear(x2, w, b2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-4, atol=1e-4)


def test_fake_implementation_gives_shape_and_dtype() -> None:
    packed, scale = seeded_layer(40, 96, 32)
    with torch.device("meta"):
        y = torch.ops.trit.linear(torch.empty(2, 7, 96, dtype=torch.bfloat16), packed.to("meta"),
                                  scale.to("meta"), 32, None, True)
    assert y.shape == (2, 7, 40) and y.dtype == torch.bfloat16


def test_torch_compile_fullgraph_on_cpu() -> None:
    """No graph break through the op (and its autograd) when traced; the GPU test runs Inductor on Triton."""
    model = trit_mlp(96, 64, 32, torch.float32)
    layers = [model[0], model[2]]
    x = torch.randn(3, 96)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    torch.testing.assert_close(compiled(x), eager)
    compiled(x).sum().backward()
    assert layers[0].bias.grad is not None


def test_warm_up_runs_each_size_once_a_shape(monkeypatch) -> None:
    from trit.synthetic import random_packed

    g = torch.Generator().manual_seed(0)
    packed, scale = random_packed((24, 40), "cpu", g), torch.full((24, 3), 0.1, dtype=torch.float16)  # K=160, g64
    calls = []
    monkeypatch.setattr(ops, "linear", lambda x, *a: calls.append(tuple(x.shape)) or x.new_zeros(x.shape[0], 24))
    assert ops.warm_up(150, (packed, scale), 64, torch.float32, ms=(1, 17)) == 2
    assert calls == [(1, 150), (17, 150)]
    assert ops.warm_up(150, (packed, scale), 64, torch.float32, ms=(1, 17)) == 0  # this shape is warm
    assert ops.warm_up(150, (packed[:8], scale[:8]), 64, torch.float32, ms=(1, 17)) == 2  # another is not


def test_warm_up_wanted_follows_the_device_and_trit_warmup(monkeypatch) -> None:
    monkeypatch.delenv("TRIT_WARMUP", raising=False)
    assert ops.warm_up_wanted(torch.device("cuda")) and not ops.warm_up_wanted(torch.device("cpu"))
    monkeypatch.setenv("TRIT_WARMUP", "0")
    assert not ops.warm_up_wanted(torch.device("cuda"))
    monkeypatch.setenv("TRIT_WARMUP", "1")
    assert ops.warm_up_wanted(torch.device("cpu"))


def test_warm_up_of_a_model_calls_the_real_op_on_every_plane() -> None:
    from transformers import AutoConfig

    from trit.nn import warm_up
    from trit.synthetic import random_model

    cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    model = random_model(cfg, fmt.TritConfig(group_size=32, planes=2), "cpu", torch.float32, seed=3)
    # distinct (in, out) shapes: q/o 64->64, k/v 64->32, gate/up 64->96, down 96->64; a second plane has
    # its first's shape, so it compiles nothing new
    assert warm_up(model, torch.float32) == 4 * len(ops.WARM_UP_MS)
    assert warm_up(model, torch.float32) == 0


def test_custom_op_passes_opcheck() -> None:
    packed, scale = seeded_layer(24, 64, 32)
    x = torch.randn(2, 3, 64)
    bias = torch.randn(24)
    torch.library.opcheck(torch.ops.trit.linear.default, (x, packed, scale, 32, bias))
    torch.library.opcheck(torch.ops.trit.linear.default, (x, packed, scale, 32, None))
    y = torch.ops.trit.linear(x, packed, scale, 32, bias)
    assert y.shape == (2, 3, 24)
    torch.testing.assert_close(y, reference.linear(x, packed, scale, 32, bias), rtol=1e-5, atol=1e-5)


def _tiled_layer(n: int = 40, k: int = 576, g: int = 64):
    from trit.kernels.cuda import mma

    packed, scale = seeded_layer(n, k, g)
    return packed, scale, mma.repack(packed, scale, g, k)


def test_the_tiled_op_equals_the_file_layout_op_and_passes_opcheck() -> None:
    packed, scale, r = _tiled_layer()
    x, b = torch.randn(2, 3, 576), torch.randn(40)
    y = torch.ops.trit.linear_tiled(x, r.wq, r.sc, 40, 64, b)
    # the layout holds bf16 scales: the same layer with its scales rounded so
    torch.testing.assert_close(y, reference.linear(x, packed, scale.to(torch.bfloat16).float(), 64, b),
                               rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.trit.linear_tiled.default, (x, r.wq, r.sc, 40, 64, b))
    with torch.device("meta"):
        z = torch.ops.trit.linear_tiled(torch.empty(5, 576, dtype=torch.bfloat16), r.wq.to("meta"), r.sc.to("meta"),
                                        40, 64, None)
    assert z.shape == (5, 40) and z.dtype == torch.bfloat16


def test_the_tiled_op_passes_gradients_to_activations_and_bias() -> None:
    packed, scale, r = _tiled_layer(24, 64, 32)
    x, b = torch.randn(5, 64, requires_grad=True), torch.randn(24, requires_grad=True)
    ops.linear_tiled(x, r.wq, r.sc, 24, 32, b).square().sum().backward()
    w = fmt.dequantize(packed, scale.to(torch.bfloat16).float(), 64)
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.nn.functional.linear(x2, w, b2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.grad, b2.grad, rtol=1e-4, atol=1e-4)


def test_a_tiled_layer_computes_the_same_and_refuses_to_save() -> None:
    import pytest

    model = trit_mlp(96, 64, 32, torch.float32)
    x = torch.randn(3, 96)
    first = model[0]
    assert "CUDA, not cpu" in first.tile_refusal(torch.bfloat16)
    for layer in (model[0], model[2]):
        layer.weight_scale.copy_(layer.weight_scale.to(torch.bfloat16))  # the layout's scales are bf16
    want = model(x)
    for layer in (model[0], model[2]):
        layer.tile()
    assert first.tiled and "layout=mma" in repr(first) and not hasattr(first, "weight_packed")
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="mma layout"):
        model.state_dict()
    with pytest.raises(RuntimeError, match="mma layout"):
        first.planes_tensors()
    assert first.tile_refusal(torch.bfloat16) == "tiled already"
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)
    assert ops.warm_up(96, first.planes_for_forward()[0], 32, torch.float32, ms=(1, 5)) == 2


def test_tile_refusal_says_why_a_layer_stays_in_format_v1(monkeypatch) -> None:
    import pytest

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert "CUDA, not cpu" in ops.tile_refusal(cpu, torch.bfloat16, 64, 576, False)
    assert "bf16" in ops.tile_refusal(cuda, torch.float16, 64, 576, False)
    assert "int8" in ops.tile_refusal(cuda, torch.bfloat16, 64, 576, True)
    assert "group size 256" in ops.tile_refusal(cuda, torch.bfloat16, 256, 576, False)
    assert "multiple of 8" in ops.tile_refusal(cuda, torch.bfloat16, 64, 580, False)
    assert "format v1's Triton kernels are as fast" in ops.tile_refusal(cuda, torch.bfloat16, 64, 4096, False, 4096)
    # Llama-3-8B's qkv (24Mi weights) is over the line: whatever else refuses it, the size does not
    assert "format v1's Triton kernels" not in (ops.tile_refusal(cuda, torch.bfloat16, 64, 4096, False, 6144) or "")
    # Qwen2-1.5B's gate_up (26Mi weights, K = 1536) is large enough but has too few inputs
    assert "K = 1536 < 2048" in ops.tile_refusal(cuda, torch.bfloat16, 64, 1536, False, 17920)
    monkeypatch.setenv("TRIT_LAYOUT", "v1")
    assert ops.tile_refusal(cuda, torch.bfloat16, 64, 576, False) == "TRIT_LAYOUT=v1"
    monkeypatch.setenv("TRIT_LAYOUT", "mma")  # forced: any device and dtype the layout can hold
    assert ops.tile_refusal(cpu, torch.float32, 64, 576, False) is None
    assert "group size 256" in ops.tile_refusal(cpu, torch.float32, 256, 576, False)
    monkeypatch.setenv("TRIT_LAYOUT", "tiles")
    with pytest.raises(ValueError, match="TRIT_LAYOUT='tiles'"):
        ops.tile_refusal(cuda, torch.bfloat16, 64, 576, False)
