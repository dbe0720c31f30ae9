"""The one ternary linear op, ``trit::linear``, and the one place a kernel is chosen.

``torch.ops.trit.linear(x, packed, scale, group_size, bias, act_int8)`` is a
``torch.library`` custom op with a fake (meta) implementation, so that
``torch.compile(fullgraph=True)`` and vLLM trace through it as one node. At run
time it calls :func:`choose_kernel`, which walks an ordered list of candidates
and takes the first that can run the problem; each refusal carries its reason
(the shape of vLLM's ``choose_mp_linear_kernel``).

With ``act_int8`` (BitNet's W1.58A8) the activations are quantized to int8 per
token first. A kernel with its own int8 path (``run_a8``) takes the original
activations; any other gets them quantized and dequantized (``x_q / s``),
which is the same arithmetic up to one rounding of the product.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trit.format import padded_k, unpack
from trit.kernels import cpu, reference


@dataclass(frozen=True)
class Problem:
    """What a kernel is asked to do: ``(M, K) @ (N, K).T`` with groups of ``group_size``."""

    m: int
    n: int
    k: int
    group_size: int
    device_type: str
    dtype: torch.dtype
    act_int8: bool = False

    @classmethod
    def of(cls, x: torch.Tensor, packed: torch.Tensor, group_size: int, act_int8: bool = False) -> Problem:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return cls(m, packed.shape[0], x.shape[-1], group_size, x.device.type, x.dtype, act_int8)


LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class Kernel:
    name: str
    refuse: Callable[[Problem], str | None]  # None: can run it; else why not
    run: LinearFn | None  # None: an int8-activation kernel only (its refusal turns other problems away)
    run_a8: LinearFn | None = None  # its own int8-activation path, if it has one

    def __call__(self, x, packed, scale, group_size, bias, act_int8: bool = False) -> torch.Tensor:
        if not act_int8:
            assert self.run is not None, f"{self.name} takes int8 activations only"
            return self.run(x, packed, scale, group_size, bias)
        if self.run_a8 is not None:
            return self.run_a8(x, packed, scale, group_size, bias)
        assert self.run is not None
        return self.run(reference.fake_quantize_activations_int8(x), packed, scale, group_size, bias)


def _reference_refuse(p: Problem) -> str | None:
    return None


def _cpu_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu.refuse(padded_k(p.k, p.group_size), p.group_size)


REFERENCE = Kernel("reference", _reference_refuse, reference.linear, reference.linear_a8)
CPU = Kernel("cpu_words", _cpu_refuse, cpu.linear)


def _candidates() -> tuple[Kernel, ...]:
    from trit.kernels import triton_candidates  # imports triton lazily, and only if present

    return (*triton_candidates(), CPU, REFERENCE)


@dataclass(frozen=True)
class Choice:
    kernel: Kernel
    refused: tuple[tuple[str, str], ...]  # (kernel name, reason) for each candidate passed over

    def explain(self) -> str:
        lines = [f"{name}: refused: {why}" for name, why in self.refused]
        return "\n".join([*lines, f"{self.kernel.name}: chosen"])


@functools.lru_cache(maxsize=4096)
def choose_kernel(problem: Problem) -> Choice:
    """The first candidate that can run ``problem``; the reference always can."""
    refused = []
    for kernel in _candidates():
        why = kernel.refuse(problem)
        if why is None:
            return Choice(kernel, tuple(refused))
        refused.append((kernel.name, why))
    raise AssertionError("the reference kernel refused a problem")  # unreachable


@torch.library.custom_op("trit::linear", mutates_args=())
def linear(
    x: torch.Tensor,  # (..., K) bf16/fp16/fp32
    packed: torch.Tensor,  # (N, K_pad // 4) uint8
    scale: torch.Tensor,  # (N, G) fp16/bf16
    group_size: int,
    bias: torch.Tensor | None = None,  # (N,)
    act_int8: bool = False,
) -> torch.Tensor:  # (..., N) x.dtype
    """Ternary linear layer: ``x @ dequantize(packed, scale).T + bias`` (``x`` int8 per token if ``act_int8``)."""
    kernel = choose_kernel(Problem.of(x, packed, group_size, act_int8)).kernel
    return kernel(x, packed, scale, group_size, bias, act_int8)


@linear.register_fake
def _(x, packed, scale, group_size, bias=None, act_int8=False):
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    x, packed, scale, group_size, bias, *_ = inputs
    ctx.save_for_backward(packed, scale)
    ctx.group_size, ctx.in_features, ctx.has_bias = group_size, x.shape[-1], bias is not None


def _backward(ctx, grad):  # (..., N) -> grads of (x, packed, scale, group_size, bias, act_int8)
    """Gradients for the activations and the bias (the codes are not trainable); int8 rounding passes straight through."""
    packed, scale = ctx.saved_tensors
    values = unpack(packed).to(grad.dtype)  # (N, K_pad): shifts and masks only, no cached table to leak from a trace
    n, k_pad = values.shape
    g = k_pad if ctx.group_size == -1 else ctx.group_size
    w = (values.view(n, k_pad // g, g) * scale.to(grad.dtype)[:, :, None]).view(n, k_pad)[:, : ctx.in_features]
    grad_x = grad @ w
    grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, None, None, None, grad_bias, None


linear.register_autograd(_backward, setup_context=_setup_context)


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


def warm_up(in_features: int, packed: torch.Tensor, scale: torch.Tensor, group_size: int, dtype: torch.dtype,
            act_int8: bool = False, ms: tuple[int, ...] = WARM_UP_MS) -> int:
    """Run ``trit::linear`` once at each M of ``ms`` on zeros, once a process per layer shape.

    The kernels the op will choose for those sizes compile (or load from Triton's disk cache) now, at
    load, instead of during the first requests. Returns the number of calls made (0 for a shape
    already warmed).
    """
    key = (packed.device, tuple(packed.shape), tuple(scale.shape), scale.dtype, in_features, group_size, dtype,
           act_int8, ms)
    if key in _WARMED:
        return 0
    _WARMED.add(key)
    with torch.inference_mode():
        for m in ms:
            linear(torch.zeros(m, in_features, dtype=dtype, device=packed.device), packed, scale, group_size,
                   None, act_int8)
    return len(ms)
