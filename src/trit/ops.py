"""The ternary linear ops, ``trit::linear`` (format v1) and ``trit::linear_tiled`` (the mma layout).

Each is an operator defined through ``torch.library`` with a fake (meta)
implementation and an autograd formula, so that ``torch.compile(fullgraph=True)``
and vLLM trace through it as one node: the graph boundary of a layer's forward
(:mod:`trit.linear` calls one a trit-plane). They are defined with
``torch.library.Library`` rather than the ``custom_op`` decorator, whose
wrapper checks every call's outputs for aliasing, a cost paid on every call
outside a CUDA graph (docs/kernels.md). At run time each runs the kernel
:func:`trit.kernels.registry.choose_kernel` picks for its problem.

With ``act_int8`` (BitNet's W1.58A8) the activations are quantized to int8 per
token first. A kernel with its own int8 path takes the original activations;
any other gets them quantized and dequantized (``x_q / s``), which is the same
arithmetic up to one rounding of the product.
"""

from __future__ import annotations

import torch

from trit.format import dequantize
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda.mma import MmaWeights
from trit.kernels.registry import Problem, choose_kernel

_LIB = torch.library.Library("trit", "DEF")
_LIB.define("linear(Tensor x, Tensor packed, Tensor scale, int group_size, Tensor? bias=None, bool act_int8=False) "
            "-> Tensor")
_LIB.define("linear_tiled(Tensor x, Tensor wq, Tensor sc, int out_features, int group_size, Tensor? bias=None, "
            "bool act_int8=False) -> Tensor")


def _linear(x, packed, scale, group_size, bias=None, act_int8=False):
    kernel = choose_kernel(Problem.of(x, packed.shape[0], group_size, act_int8)).kernel
    return kernel(x, packed, scale, group_size, bias, act_int8)


def _linear_tiled(x, wq, sc, out_features, group_size, bias=None, act_int8=False):
    kernel = choose_kernel(Problem.of(x, out_features, group_size, act_int8, "mma")).kernel
    return kernel.run_tiled(x, MmaWeights(wq, sc, out_features, x.shape[-1], group_size), bias, act_int8)


_LIB.impl("linear", _linear, "CompositeExplicitAutograd")
_LIB.impl("linear_tiled", _linear_tiled, "CompositeExplicitAutograd")


def linear(
    x: torch.Tensor,  # (..., K) bf16/fp16/fp32
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G) fp16/bf16
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
    act_int8: bool = False,
) -> torch.Tensor:  # (..., N) x.dtype
    """Ternary linear layer: ``x @ dequantize(packed, scale).T + bias`` (``x`` int8 per token if ``act_int8``)."""
    return torch.ops.trit.linear.default(x, packed, scale, group_size, bias, act_int8)


def linear_tiled(
    x: torch.Tensor,  # (..., K) bf16
    wq: torch.Tensor,  # (NT, KS, 32, 4) int32: the codes in the mma layout (trit.kernels.cuda.mma)
    sc: torch.Tensor,  # (NT, GP, 8) int32: the scales, bf16 pairs
    out_features: int,
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
    act_int8: bool = False,
) -> torch.Tensor:  # (..., N) x.dtype
    """The same layer as ``trit::linear``, its weights repacked at load into the mma layout."""
    return torch.ops.trit.linear_tiled.default(x, wq, sc, out_features, group_size, bias, act_int8)


@torch.library.register_fake("trit::linear_tiled", lib=_LIB)
def _(x, wq, sc, out_features, group_size, bias=None, act_int8=False):
    return x.new_empty((*x.shape[:-1], out_features))


def _setup_tiled(ctx, inputs, output) -> None:
    x, wq, sc, out_features, group_size, bias, *_ = inputs
    ctx.save_for_backward(wq, sc)
    ctx.shape = (out_features, x.shape[-1], group_size)
    ctx.has_bias = bias is not None


def _backward_tiled(ctx, grad):
    wq, sc = ctx.saved_tensors
    grad_x = grad @ cuda_launch.dense(MmaWeights(wq, sc, *ctx.shape), grad.dtype)
    grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, None, None, None, None, grad_bias, None


torch.library.register_autograd("trit::linear_tiled", _backward_tiled, setup_context=_setup_tiled, lib=_LIB)


@torch.library.register_fake("trit::linear", lib=_LIB)
def _(x, packed, scale, group_size, bias=None, act_int8=False):
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    x, packed, scale, group_size, bias, *_ = inputs
    ctx.save_for_backward(packed, scale)
    ctx.group_size, ctx.in_features, ctx.has_bias = group_size, x.shape[-1], bias is not None


def _backward(ctx, grad):  # (..., N) -> grads of (x, packed, scale, group_size, bias, act_int8)
    """Gradients for the activations and the bias (the codes are not trainable); int8 rounding passes straight through."""
    packed, scale = ctx.saved_tensors
    grad_x = grad @ dequantize(packed, scale, ctx.in_features, grad.dtype)  # (N, K)
    grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, None, None, None, grad_bias, None


torch.library.register_autograd("trit::linear", _backward, setup_context=_setup_context, lib=_LIB)
