"""Which machine a benchmark ran on, beyond the GPU's name: the host CPU and the GPU's UUID (runs of one GPU model
on different machines can differ, and host time is the CPU's)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The host CPU's model name, from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def first_visible_gpu() -> str | None:
    """The GPU a process started here runs on, as nvidia-smi's ``-i`` takes it (nvidia-smi does not read
    ``CUDA_VISIBLE_DEVICES``): the variable's first entry where it is set, GPU 0 where it is not; None where it
    hides every GPU (set, but empty)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "0" if visible is None else (visible.split(",")[0].strip() or None)


def gpu_uuid() -> str | None:
    """nvidia-smi's UUID of :func:`first_visible_gpu`; None without nvidia-smi, with no GPU visible or without a
    UUID in its answer."""
    index = first_visible_gpu()
    if shutil.which("nvidia-smi") is None or index is None:
        return None
    try:
        proc = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.split()
    # an error ("No devices were found") is printed to stdout too
    return out[0] if proc.returncode == 0 and out and out[0].startswith(("GPU-", "MIG-")) else None
