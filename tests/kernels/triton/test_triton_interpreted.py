"""Runs test_triton.py and test_int8_rows_triton.py on the CPU under TRITON_INTERPRET=1 (which must be set before Triton compiles)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU test_triton.py runs the kernels directly")
@pytest.mark.timeout(1900)  # its own subprocess limit is 1800 s
def test_kernels_interpreted_on_cpu() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    here = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_triton.py"),
         str(here / "test_int8_rows_triton.py")],
        capture_output=True, text=True, env=env, cwd=here.parents[2], timeout=1800,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 40 and "failed" not in summary, summary
