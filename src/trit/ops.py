"""The one ternary linear op, ``trit::linear``, and the one place a kernel is chosen.

``torch.ops.trit.linear(x, packed, scale, group_size, bias)`` is a
``torch.library`` custom op with a fake (meta) implementation, so that
``torch.compile(fullgraph=True)`` and vLLM trace through it as one node. At run
time it calls :func:`choose_kernel`, which walks an ordered list of candidates
and takes the first that can run the problem; each refusal carries its reason
(the shape of vLLM's ``choose_mp_linear_kernel``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trit.format import padded_k
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

    @classmethod
    def of(cls, x: torch.Tensor, packed: torch.Tensor, group_size: int) -> Problem:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return cls(m, packed.shape[0], x.shape[-1], group_size, x.device.type, x.dtype)


LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class Kernel:
    name: str
    refuse: Callable[[Problem], str | None]  # None: can run it; else why not
    run: LinearFn


def _reference_refuse(p: Problem) -> str | None:
    return None


def _cpu_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu.refuse(padded_k(p.k, p.group_size), p.group_size)


REFERENCE = Kernel("reference", _reference_refuse, reference.linear)
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
) -> torch.Tensor:  # (..., N) x.dtype
    """Ternary linear layer: ``x @ dequantize(packed, scale).T + bias``."""
    kernel = choose_kernel(Problem.of(x, packed, group_size)).kernel
    return kernel.run(x, packed, scale, group_size, bias)


@linear.register_fake
def _(x, packed, scale, group_size, bias=None):
    return x.new_empty((*x.shape[:-1], packed.shape[0]))
