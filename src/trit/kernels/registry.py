"""Kernel choice: what a kernel is asked to do, the ordered list of candidates, and the one function that picks.

Each candidate says two things apart:

- ``refuse(problem)``: whether it *can* run the problem (device, dtype, layout,
  shape); ``None``, or the reason it cannot;
- ``rule(problem)``: whether, where no tuned table names a kernel, the rule of
  thumb gives it this problem; ``None``, or why not.

:func:`choose_kernel` takes, among the candidates that can run the problem,
the one this GPU's tuned table measured fastest (:mod:`trit.kernels.tuning`),
else the first whose rule takes it (the shape of vLLM's
``choose_mp_linear_kernel``); :meth:`Choice.explain` prints every candidate's
answer. The reference always can. A candidate can be switched off by name, for
a comparison or to step around a broken kernel: :func:`disable`, or
``TRIT_DISABLE_KERNELS=triton_gemv,triton_skinny`` in the environment (both
checked against the names here).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trit.format import padded_k
from trit.kernels import cpu, cpu_native, reference, tuning
from trit.kernels.cuda import launch as cuda_launch
from trit.kernels.cuda.mma import MmaWeights
from trit.kernels.triton import available as triton_available

DISABLE_ENV = "TRIT_DISABLE_KERNELS"


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
    def of(cls, x: torch.Tensor, n: int, group_size: int, act_int8: bool = False, layout: str = "v1") -> Problem:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return cls(m, n, x.shape[-1], group_size, x.device.type, x.dtype, act_int8, layout)

    @property
    def key(self) -> str:
        """Its entry in the tuned tables."""
        return tuning.key(self.m, self.n, self.k, self.group_size, self.dtype, self.act_int8)


LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]
TiledFn = Callable[[torch.Tensor, "MmaWeights", "torch.Tensor | None"], torch.Tensor]


def _always(problem: Problem) -> str | None:
    return None


@dataclass(frozen=True)
class Kernel:
    name: str
    refuse: Callable[[Problem], str | None]  # None: can run it; else why not
    run: LinearFn | None = None  # format v1; None: int8 activations only, or the mma layout only
    run_a8: LinearFn | None = None  # its own int8-activation path on format v1, if it has one
    tiled: TiledFn | None = None  # its path for layers in the mma layout, if it has one
    tiled_a8: TiledFn | None = None  # its own int8-activation path on the mma layout, if it has one
    rule: Callable[[Problem], str | None] = _always  # without a tuned choice: None takes the problem

    def __call__(self, x, packed, scale, group_size, bias, act_int8: bool = False) -> torch.Tensor:
        """Run it on format v1; with ``act_int8`` and no int8 path of its own, on the activations quantized and
        dequantized."""
        if not act_int8:
            assert self.run is not None, f"{self.name} takes int8 activations only"
            return self.run(x, packed, scale, group_size, bias)
        if self.run_a8 is not None:
            return self.run_a8(x, packed, scale, group_size, bias)
        assert self.run is not None
        return self.run(cuda_launch.fake_quantize(x), packed, scale, group_size, bias)

    def run_tiled(self, x: torch.Tensor, r: MmaWeights, bias, act_int8: bool = False) -> torch.Tensor:
        """Run it on the mma layout; with ``act_int8`` and no int8 path of its own, as :meth:`__call__`."""
        if act_int8 and self.tiled_a8 is not None:
            return self.tiled_a8(x, r, bias)
        assert self.tiled is not None, f"{self.name} takes int8 activations only"
        return self.tiled(cuda_launch.fake_quantize(x) if act_int8 else x, r, bias)


def _cpu_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu.refuse(padded_k(p.k, p.group_size), p.group_size)


def _native_refuse(p: Problem) -> str | None:
    if p.device_type != "cpu":
        return f"runs on the CPU, not {p.device_type}"
    return cpu_native.refuse(padded_k(p.k, p.group_size), p.group_size, p.dtype)


def _native_rule(p: Problem) -> str | None:
    return cpu_native.rule(p.m)


REFERENCE = Kernel("reference", lambda p: None, reference.linear, reference.linear_a8, cuda_launch.reference)
CPU = Kernel("cpu_words", _cpu_refuse, cpu.linear)
NATIVE = Kernel("cpu_native", _native_refuse, cpu_native.linear, cpu_native.linear_a8, rule=_native_rule)


@functools.cache
def _triton_candidates() -> tuple[Kernel, ...]:
    if not triton_available():
        return ()
    from trit.kernels.triton import launch

    return (
        Kernel("triton_gemm_a8", launch.refuse_gemm_a8, run_a8=launch.run_gemm_a8, rule=launch.rule_gemm_a8),
        Kernel("triton_gemv", launch.refuse_gemv, launch.run_gemv, rule=launch.rule_gemv),
        Kernel("triton_skinny", launch.refuse_skinny, launch.run_skinny, rule=launch.rule_skinny),
        Kernel("triton_gemm", launch.refuse_gemm, launch.run_gemm, rule=launch.rule_gemm),
        Kernel("triton_dequant_cublas", launch.refuse_dequant, launch.run_dequant),
    )


CUDA = (
    Kernel("cuda_wgmma_a8", cuda_launch.refuse_wgmma_a8, tiled_a8=cuda_launch.run_wgmma_a8,
           rule=cuda_launch.rule_wgmma_a8),
    Kernel("cuda_imma", cuda_launch.refuse_imma, tiled=cuda_launch.run_imma, rule=cuda_launch.rule_imma),
    Kernel("cuda_gemv", cuda_launch.refuse_gemv, tiled=cuda_launch.run_gemv, rule=cuda_launch.rule_gemv),
    Kernel("cuda_wgmma", cuda_launch.refuse_wgmma, tiled=cuda_launch.run_wgmma, rule=cuda_launch.rule_wgmma),
    Kernel("cuda_mma", cuda_launch.refuse_mma, tiled=cuda_launch.run_mma, rule=cuda_launch.rule_mma),
    Kernel("cuda_dequant_cublas", cuda_launch.refuse_dequant, tiled=cuda_launch.run_dequant),
)


def candidates() -> tuple[Kernel, ...]:
    """Every kernel, in the order :func:`choose_kernel` tries them (the Triton ones only where triton is installed)."""
    return (*CUDA, *_triton_candidates(), NATIVE, CPU, REFERENCE)


def names() -> frozenset[str]:
    """The name of every kernel this process has (the Triton ones only where triton is installed)."""
    return frozenset(k.name for k in candidates())


def _refusal(kernel: Kernel, problem: Problem) -> str | None:
    if problem.layout == "mma" and kernel.tiled is None and kernel.tiled_a8 is None:
        return "reads format v1, not the mma layout"
    if problem.layout != "mma" and kernel.run is None and kernel.run_a8 is None:
        return "reads the mma layout only"
    return kernel.refuse(problem)


def _checked(names_given: set[str], where: str) -> frozenset[str]:
    unknown = sorted(names_given - names())
    if unknown:
        raise ValueError(f"{where}: no kernel named {', '.join(unknown)}; the kernels are {', '.join(sorted(names()))}")
    if REFERENCE.name in names_given:
        raise ValueError(f"{where}: the reference kernel cannot be switched off (every problem falls back to it)")
    return frozenset(names_given)


_DISABLED: frozenset[str] | None = None  # None: not read from the environment yet


def disabled() -> frozenset[str]:
    """The kernels switched off: :func:`disable`'s, else ``TRIT_DISABLE_KERNELS``'s (checked when first read)."""
    global _DISABLED
    if _DISABLED is None:
        given = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        _DISABLED = _checked(given, f"{DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')!r}")
    return _DISABLED


def disable(*kernel_names: str) -> None:
    """Pass over these kernels from now on (not the reference); no names: enable all again."""
    global _DISABLED
    _DISABLED = _checked(set(kernel_names), "registry.disable")
    tuning.forget()


@dataclass(frozen=True)
class Choice:
    kernel: Kernel
    refused: tuple[tuple[str, str], ...]  # (kernel name, why not) for each candidate passed over
    why: str = "the rule of thumb"  # what chose it: this GPU's tuned table or the rule

    def explain(self) -> str:
        lines = [f"{name}: {why}" for name, why in self.refused]
        return "\n".join([*lines, f"{self.kernel.name}: chosen ({self.why})"])


def _choose(problem: Problem, off: frozenset[str]) -> Choice:
    can, cannot = [], {}
    for kernel in candidates():
        why = f"disabled ({DISABLE_ENV} or registry.disable)" if kernel.name in off else _refusal(kernel, problem)
        if why is None:
            can.append(kernel)
        else:
            cannot[kernel.name] = f"cannot: {why}"
    tuned = tuning.preferred(problem.key, problem.layout)
    chosen = next((k for k in can if k.name == tuned), None)
    passed: dict[str, str] = {}
    if chosen is not None:
        why = f"the tuned table of {tuning.tuned_on()}"
        passed = {k.name: f"can; the tuned table of {tuning.tuned_on()} measured {tuned} faster"
                  for k in can if k is not chosen}
    else:
        for kernel in can:
            rule = kernel.rule(problem)
            if rule is None:
                chosen = kernel
                break
            passed[kernel.name] = f"can; the rule of thumb (no tuned choice) passes it over: {rule}"
        why = "the rule of thumb" if tuned is None else f"the rule of thumb ({tuned}, the tuned choice, cannot)"
    assert chosen is not None, "the reference kernel refused a problem"  # its refusal and rule never refuse
    refused = tuple((k.name, cannot.get(k.name) or passed[k.name]) for k in candidates()
                    if k is not chosen and (k.name in cannot or k.name in passed))
    return Choice(chosen, refused, why)


def choose_kernel(problem: Problem) -> Choice:
    """The candidate that runs ``problem`` (see the module docstring); the reference always can.

    Worked out once per problem, until the tuned tables change or kernels are switched on or off.
    """
    off = disabled()
    return tuning.memo(("choice", problem, off), lambda: _choose(problem, off))
