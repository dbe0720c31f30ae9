"""The one ternary linear op, ``trit::linear``.

``torch.ops.trit.linear(x, packed, scale, group_size, bias, act_int8)`` is an
operator defined through ``torch.library`` with a fake (meta) implementation
and an autograd formula, so that ``torch.compile(fullgraph=True)`` and vLLM
trace through it as one node. It is defined with ``torch.library.Library``
rather than the ``custom_op`` decorator: the decorator's wrapper checks every
call's outputs for aliasing and cost about 2 us more a call on the CPU here (5.2
against 3.0 under ``inference_mode``), paid on every call outside a CUDA graph
(benchmarks/host_path.py). At run
time it runs the kernel :func:`trit.kernels.registry.choose_kernel` picks.
:func:`linear_planes` is a layer's forward (one call a trit-plane, summed), the
same for the runtime's ``TritLinear`` and the vLLM plugin; :func:`warm_up`
compiles a layer shape's kernels before the first request needs them.

With ``act_int8`` (BitNet's W1.58A8) the activations are quantized to int8 per
token first. A kernel with its own int8 path (``run_a8``) takes the original
activations; any other gets them quantized and dequantized (``x_q / s``),
which is the same arithmetic up to one rounding of the product.
"""

from __future__ import annotations

import torch

from trit.format import dequantize
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda.launch import tile_refusal  # noqa: F401  (for the vLLM plugin, which stands on ops)
from trit.kernels.cuda.mma import MmaWeights, repack  # noqa: F401  (the same)
from trit.kernels.registry import Problem, choose_kernel

_LIB = torch.library.Library("trit", "DEF")
_LIB.define("linear(Tensor x, Tensor packed, Tensor scale, int group_size, Tensor? bias=None, bool act_int8=False) "
            "-> Tensor")
_LIB.define("linear_tiled(Tensor x, Tensor wq, Tensor sc, int out_features, int group_size, Tensor? bias=None) "
            "-> Tensor")


def _linear(x, packed, scale, group_size, bias=None, act_int8=False):
    kernel = choose_kernel(Problem.of(x, packed, group_size, act_int8)).kernel
    return kernel(x, packed, scale, group_size, bias, act_int8)


def _linear_tiled(x, wq, sc, out_features, group_size, bias=None):
    r = MmaWeights(wq, sc, out_features, x.shape[-1], group_size)
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    problem = Problem(m, out_features, x.shape[-1], group_size, x.device.type, x.dtype, False, "mma")
    return choose_kernel(problem).kernel.tiled(x, r, bias)


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
) -> torch.Tensor:  # (..., N) x.dtype
    """The same layer as ``trit::linear``, its weights repacked at load into the mma layout."""
    return torch.ops.trit.linear_tiled.default(x, wq, sc, out_features, group_size, bias)


@torch.library.register_fake("trit::linear_tiled", lib=_LIB)
def _(x, wq, sc, out_features, group_size, bias=None):
    return x.new_empty((*x.shape[:-1], out_features))


def _setup_tiled(ctx, inputs, output) -> None:
    x, wq, sc, out_features, group_size, bias = inputs
    ctx.save_for_backward(wq, sc)
    ctx.shape = (out_features, x.shape[-1], group_size)
    ctx.has_bias = bias is not None


def _backward_tiled(ctx, grad):
    wq, sc = ctx.saved_tensors
    grad_x = grad @ cuda_launch.dense(MmaWeights(wq, sc, *ctx.shape), grad.dtype)
    grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, None, None, None, None, grad_bias


torch.library.register_autograd("trit::linear_tiled", _backward_tiled, setup_context=_setup_tiled, lib=_LIB)

Plane = tuple[torch.Tensor, torch.Tensor] | MmaWeights


def linear_planes(
    x: torch.Tensor,  # (..., K)
    planes: list[Plane],  # each plane's (packed (N, K_pad // 4) uint8, scale (N, G)), or its mma layout
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
    act_int8: bool = False,
) -> torch.Tensor:  # (..., N)
    """A ternary layer of one or more trit-planes: ``trit::linear`` (or ``trit::linear_tiled``) per plane, summed
    (the bias added once)."""
    first, *rest = planes
    y = _plane(x, first, group_size, bias, act_int8)
    for plane in rest:
        y = y + _plane(x, plane, group_size, None, act_int8)
    return y


def _plane(x: torch.Tensor, plane: Plane, group_size: int, bias: torch.Tensor | None, act_int8: bool) -> torch.Tensor:
    if isinstance(plane, MmaWeights):
        return linear_tiled(x, plane.wq, plane.sc, plane.n, group_size, bias)
    packed, scale = plane
    return linear(x, packed, scale, group_size, bias, act_int8)


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


# ---------------------------------------------------------------------------- warm-up

# Prefill sizes a kernel specializes on: the decode GEMV's unrolled M (1-4), each M bucket of the tuned
# tables (powers of two) once divisible by 16 and once not (Triton compiles both), the dequantize path.
WARM_UP_MS = (1, 2, 3, 4, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1024)
_WARMED: set[tuple] = set()


def warm_up_wanted(device: torch.device) -> bool:
    """``TRIT_WARMUP``: ``1`` always, ``0`` never, unset: on CUDA (where kernels compile)."""
    import os

    flag = os.environ.get("TRIT_WARMUP", "")
    return flag == "1" or (flag != "0" and device.type == "cuda")


def warm_up(in_features: int, plane: Plane, group_size: int, dtype: torch.dtype, act_int8: bool = False,
            ms: tuple[int, ...] = WARM_UP_MS) -> int:
    """Run the layer's op once at each M of ``ms`` on zeros, once a process per layer shape.

    ``plane``: ``(packed, scale)`` in format v1, or the layer's mma layout. The kernels the op will choose
    for those sizes compile (or load from the disk caches) now, at load, instead of during the first
    requests. Returns the number of calls made (0 for a shape already warmed).
    """
    first = plane.wq if isinstance(plane, MmaWeights) else plane[0]
    second = plane.sc if isinstance(plane, MmaWeights) else plane[1]
    key = (first.device, tuple(first.shape), tuple(second.shape), second.dtype, in_features, group_size, dtype,
           act_int8, ms, isinstance(plane, MmaWeights))
    if key in _WARMED:
        return 0
    _WARMED.add(key)
    with torch.inference_mode():
        for m in ms:
            _plane(torch.zeros(m, in_features, dtype=dtype, device=first.device), plane, group_size, None, act_int8)
    return len(ms)
