"""What the kernels' default configs need to know about the GPU they launch on."""

from __future__ import annotations

import functools

import torch

from trit.kernels import pdl

# the H100/H200 count, for config choices made where no GPU is present (the CPU interpreter, offline compiles)
FALLBACK_SMS = 132


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count() -> int:
    """Streaming multiprocessors of the current CUDA device, or :data:`FALLBACK_SMS` without one."""
    if not torch.cuda.is_available():
        return FALLBACK_SMS
    return _sms(torch.cuda.current_device())


def pdl_kwargs(x: torch.Tensor) -> dict:
    """``PDL=True`` (the kernel waits before it reads ``x``) and ``launch_pdl=True`` for a Triton kernel on
    ``x``'s CUDA device when ``TRIT_PDL=1`` asks for programmatic dependent launch and the device takes it
    (:func:`trit.kernels.pdl.here`); else none: the kernel's default, a plain launch."""
    if not x.is_cuda:
        return {}
    return {"PDL": True, "launch_pdl": True} if pdl.here() else {}
