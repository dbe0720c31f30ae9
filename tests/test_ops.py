"""``trit::linear`` and ``trit::linear_tiled`` on the CPU: int8 activations, gradients, the fake implementations."""

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


def test_the_tiled_op_with_int8_activations_equals_the_reference() -> None:
    packed, scale, r = _tiled_layer()
    x, b = torch.randn(3, 576), torch.randn(40)
    y = ops.linear_tiled(x, r.wq, r.sc, 40, 64, b, True)  # off CUDA: the reference, on x_q / s
    want = reference.linear_a8(x, packed, scale.to(torch.bfloat16).float(), 64, b)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert (ops.linear_tiled(x, r.wq, r.sc, 40, 64, b) - want).abs().max() > 1e-4  # the flag is not ignored
    torch.library.opcheck(torch.ops.trit.linear_tiled.default, (x, r.wq, r.sc, 40, 64, b, True))
