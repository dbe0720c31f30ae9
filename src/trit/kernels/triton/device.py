"""What the kernels' default configs need to know about the GPU they launch on."""

from __future__ import annotations

import functools

import torch

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
