"""``trit bench a8``: BitNet's W1.58A8 prefill on int8 tensor cores, against bf16 cuBLAS and trit's bf16 path.

For BitNet b1.58 2B4T and Llama-3-8B layer shapes (one scale per row, as an
imported BitNet checkpoint has) and prefill sizes M, it times in the same run:
``trit::linear`` with int8 activations as it dispatches (the int8 kernels from
M = 64, decoding in the GEMM below M = 256 and through a dense int8 copy of the
codes from there; quantization of the activations and the copy included), the same problem through
trit's bf16 kernels on ``x_q / s`` (what runs without the int8 kernel), and
bf16 ``F.linear`` (cuBLAS) on a dense weight. Device time from CUDA graph
replays; weights rotate over copies several times the L2, as in
:mod:`trit.bench.kernels`. Writes ``a8.json`` under ``--out``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from trit.bench.kernels import copies_for, copy_bandwidth, ternary_layer

SHAPES = {
    "bitnet-2b4t": (("qkv", 3840, 2560), ("o", 2560, 2560), ("gate_up", 13824, 2560), ("down", 2560, 6912)),
    "llama3-8b": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)),
}
MS = (64, 512, 2048, 8192)
GROUP = -1


def bench_problem(n: int, k: int, m: int, l2: int) -> dict:
    from trit.kernels import reference, registry, tuning
    from trit.kernels.triton import gemm_a8, launch

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    layers = [ternary_layer(n, k, GROUP) for _ in range(copies_for(n * k // 4, l2))]
    key = tuning.key(m, n, k, GROUP, torch.bfloat16)

    dense = m >= launch.A8_DENSE_MIN_M
    run = gemm_a8.dense_a8 if dense else gemm_a8.gemm_a8

    def make_calls(cfg):
        return [lambda p=p, s=s: run(x, p.view(torch.int32), s, GROUP, None, cfg) for p, s in layers]

    best, best_us = tuning.tune(make_calls, gemm_a8.dense_configs() if dense else gemm_a8.configs_for(m, GROUP))
    tuning.remember("dense_a8" if dense else "gemm_a8", key, best, persist=False)
    out: dict = {"tuned": {"kernel": "dense_a8" if dense else "gemm_a8", "config": asdict(best), "us": best_us}}
    out["kernel"] = registry.choose_kernel(registry.Problem(m, n, k, GROUP, "cuda", torch.bfloat16, True)).kernel.name
    out["a8_us"] = tuning.graph_time_us(
        [lambda p=p, s=s: torch.ops.trit.linear(x, p, s, GROUP, None, True) for p, s in layers])
    xq = reference.fake_quantize_activations_int8(x)
    out["bf16_path_kernel"] = registry.choose_kernel(registry.Problem.of(xq, layers[0][0], GROUP)).kernel.name
    out["bf16_path_us"] = tuning.graph_time_us(
        [lambda p=p, s=s: torch.ops.trit.linear(reference.fake_quantize_activations_int8(x), p, s, GROUP, None)
         for p, s in layers])
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2, l2))]
    out["cublas_bf16_us"] = tuning.graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in weights])
    y = torch.ops.trit.linear(x, layers[0][0], layers[0][1], GROUP, None, True).float()
    want = reference.linear_a8(x, layers[0][0], layers[0][1], GROUP).float()
    out["rel_err_vs_reference"] = ((y - want).norm() / want.norm()).item()
    return out


def main(out_dir: Path) -> int:
    if not torch.cuda.is_available():
        print("trit bench a8 needs a CUDA GPU", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bw = copy_bandwidth()
    rows, start = [], time.time()
    for model, shapes in SHAPES.items():
        for layer, n, k in shapes:
            for m in MS:
                r = bench_problem(n, k, m, l2)
                r.update(model=model, layer=layer, n=n, k=k, m=m,
                         speedup_vs_cublas_bf16=r["cublas_bf16_us"] / r["a8_us"],
                         speedup_vs_bf16_path=r["bf16_path_us"] / r["a8_us"],
                         a8_tops=2 * m * n * k / (r["a8_us"] * 1e-6) / 1e12)
                rows.append(r)
                print(f"{model:>11} {layer:>7} {n:>5}x{k:<5} M={m:<5} {r['kernel']:>15} a8 {r['a8_us']:8.1f} us "
                      f"bf16-path {r['bf16_path_us']:8.1f} us cuBLAS {r['cublas_bf16_us']:8.1f} us "
                      f"x{r['speedup_vs_cublas_bf16']:5.2f} vs cuBLAS {r['a8_tops']:6.0f} TOPS "
                      f"err {r['rel_err_vs_reference']:.1e}", flush=True)
    summary = {}
    for model in SHAPES:
        for m in MS:
            sel = [r for r in rows if r["model"] == model and r["m"] == m]
            summary[f"{model} M={m}"] = sum(r["cublas_bf16_us"] for r in sel) / sum(r["a8_us"] for r in sel)
            print(f"summed over the layers, {model} M={m}: x{summary[f'{model} M={m}']:.2f} vs bf16 cuBLAS")
    result = {
        "command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "python": platform.python_version(), "group_size": GROUP,
        "copy_bandwidth_bytes_per_s": copy_bw, "seconds": time.time() - start,
        "summed_speedup_vs_cublas_bf16": summary, "rows": rows,
    }
    (out_dir / "a8.json").write_text(json.dumps(result, indent=1))
    return 0
