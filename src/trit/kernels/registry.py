"""Kernel choice: what a kernel is asked to do, the ordered list of candidates, and the one function that picks.

:func:`choose_kernel` walks the candidates in order and takes the first that can
run the problem; each refusal carries its reason (the shape of vLLM's
``choose_mp_linear_kernel``), and :meth:`Choice.explain` prints them. The
reference always can. A candidate can be switched off by name, for a
comparison or to step around a broken kernel: :func:`disable`, or
``TRIT_DISABLE_KERNELS=triton_gemv,triton_skinny`` in the environment.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trit.format import padded_k
from trit.kernels import cpu, cpu_native, reference, tuning
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda.mma import MmaWeights
from trit.kernels.triton import available as triton_available


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
    layout: str = "v1"  # "v1": the checkpoint's packed codes; "mma": repacked at load (trit.kernels.cuda.mma)

    @classmethod
    def of(cls, x: torch.Tensor, packed: torch.Tensor, group_size: int, act_int8: bool = False) -> Problem:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return cls(m, packed.shape[0], x.shape[-1], group_size, x.device.type, x.dtype, act_int8)


LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]
TiledFn = Callable[[torch.Tensor, "MmaWeights", "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class Kernel:
    name: str
    refuse: Callable[[Problem], str | None]  # None: can run it; else why not
    run: LinearFn | None  # None: an int8-activation kernel only (its refusal turns other problems away)
    run_a8: LinearFn | None = None  # its own int8-activation path, if it has one
    tiled: TiledFn | None = None  # its path for layers in the mma layout, if it has one

    def __call__(self, x, packed, scale, group_size, bias, act_int8: bool = False) -> torch.Tensor:
        """Run it; with ``act_int8`` and no int8 path of its own, on the activations quantized and dequantized."""
        if not act_int8:
            assert self.run is not None, f"{self.name} takes int8 activations only"
            return self.run(x, packed, scale, group_size, bias)
        if self.run_a8 is not None:
            return self.run_a8(x, packed, scale, group_size, bias)
        assert self.run is not None
        return self.run(reference.fake_quantize_activations_int8(x), packed, scale, group_size, bias)


def _cpu_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu.refuse(padded_k(p.k, p.group_size), p.group_size)


def _native_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu_native.refuse(p.m, padded_k(p.k, p.group_size), p.group_size, p.dtype)


REFERENCE = Kernel("reference", lambda p: None, reference.linear, reference.linear_a8, cuda_launch.reference)
CPU = Kernel("cpu_words", _cpu_refuse, cpu.linear)
NATIVE = Kernel("cpu_native", _native_refuse, cpu_native.linear, cpu_native.linear_a8)


@functools.cache
def _triton_candidates() -> tuple[Kernel, ...]:
    if not triton_available():
        return ()
    from trit.kernels.triton import launch

    return (
        Kernel("triton_gemm_a8", launch.refuse_gemm_a8, None, launch.run_gemm_a8),
        Kernel("triton_gemv", launch.refuse_gemv, launch.run_gemv),
        Kernel("triton_skinny", launch.refuse_skinny, launch.run_skinny),
        Kernel("triton_gemm", launch.refuse_gemm, launch.run_gemm),
        Kernel("triton_dequant_cublas", launch.refuse_dequant, launch.run_dequant),
    )


CUDA = (
    Kernel("cuda_imma", cuda_launch.refuse_imma, None, tiled=cuda_launch.run_imma),
    Kernel("cuda_gemv", cuda_launch.refuse_gemv, None, tiled=cuda_launch.run_gemv),
    Kernel("cuda_wgmma", cuda_launch.refuse_wgmma, None, tiled=cuda_launch.run_wgmma),
    Kernel("cuda_mma", cuda_launch.refuse_mma, None, tiled=cuda_launch.run_mma),
    Kernel("cuda_dequant_cublas", cuda_launch.refuse_dequant, None, tiled=cuda_launch.run_dequant),
)


def candidates() -> tuple[Kernel, ...]:
    """Every kernel, in the order :func:`choose_kernel` tries them (the Triton ones only where triton is installed)."""
    return (*CUDA, *_triton_candidates(), NATIVE, CPU, REFERENCE)


def _refusal(kernel: Kernel, problem: Problem) -> str | None:
    if problem.layout == "mma" and kernel.tiled is None:
        return "reads format v1, not the mma layout"
    if problem.layout != "mma" and kernel.run is None and kernel.run_a8 is None:
        return "reads the mma layout only"
    return kernel.refuse(problem)


def disabled() -> frozenset[str]:
    """The kernels switched off (``TRIT_DISABLE_KERNELS``, :func:`disable`)."""
    return tuning.disabled()


def disable(*names: str) -> None:
    """Pass over these kernels from now on (the reference cannot be switched off); no names: enable all again."""
    known = {k.name for k in candidates()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"no kernel named {', '.join(unknown)}; the kernels are {', '.join(sorted(known))}")
    tuning.set_disabled(frozenset(names) - {REFERENCE.name})


@dataclass(frozen=True)
class Choice:
    kernel: Kernel
    refused: tuple[tuple[str, str], ...]  # (kernel name, reason) for each candidate passed over

    def explain(self) -> str:
        lines = [f"{name}: refused: {why}" for name, why in self.refused]
        return "\n".join([*lines, f"{self.kernel.name}: chosen"])


@functools.lru_cache(maxsize=4096)
def _choose(problem: Problem, tables: int, disabled: frozenset[str]) -> Choice:
    refused = []
    for kernel in candidates():
        why = "disabled (TRIT_DISABLE_KERNELS or registry.disable)" if kernel.name in disabled else _refusal(kernel, problem)
        if why is None:
            return Choice(kernel, tuple(refused))
        refused.append((kernel.name, why))
    raise AssertionError("the reference kernel refused a problem")  # unreachable


def choose_kernel(problem: Problem) -> Choice:
    """The first candidate that can run ``problem``; the reference always can.

    Remembered per problem, until the tuned tables change (:func:`trit.kernels.tuning.generation`) or
    kernels are switched off.
    """
    return _choose(problem, tuning.generation(), tuning.disabled())
