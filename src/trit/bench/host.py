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


def gpu_uuid() -> str | None:
    """nvidia-smi's UUID of the GPU a server runs on (the first of ``CUDA_VISIBLE_DEVICES``, else GPU 0); None
    without nvidia-smi or an answer."""
    if shutil.which("nvidia-smi") is None:
        return None
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None
