"""Programmatic dependent launch (sm_90 and later): whether trit's kernels launch with it.

``TRIT_PDL=1`` asks for it. A kernel so launched may start while the kernel
ahead of it in the stream finishes, and waits (``griddepcontrol.wait``: the CUDA
kernels' ``pdl_wait``, the Triton kernels' ``gdc_wait``) before it reads
anything but its weights. Off by default: not measured yet.
"""

from __future__ import annotations

import ctypes
import os

ENV = "TRIT_PDL"
MIN_DRIVER = 12030  # CUDA 12.3: from here a CUDA graph captures a launch's programmatic edge

_DEVICES: dict[int, bool] = {}


def wanted() -> bool:
    """``TRIT_PDL``: "1" asks for programmatic dependent launch; unset, empty or "0" does not."""
    text = os.environ.get(ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{ENV}={text!r}: expected 1 (launch with programmatic dependent launch) or 0")
    return text == "1"


def driver_version() -> int:
    """The CUDA driver's version (12030: 12.3), 0 where no driver can be asked."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    v = ctypes.c_int()
    return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0


def here() -> bool:
    """Asked for, and possible on the current CUDA device: compute capability 9.0 or later, a driver of
    :data:`MIN_DRIVER` or later."""
    if not wanted():
        return False
    import torch

    dev = torch.cuda.current_device()
    if dev not in _DEVICES:
        _DEVICES[dev] = torch.cuda.get_device_capability(dev) >= (9, 0) and driver_version() >= MIN_DRIVER
    return _DEVICES[dev]
