"""``trit bench sass``: every shipped GPU kernel compiled for sm_90 without a GPU, and what its main loop issues.

    trit bench sass [--baseline benchmarks/baselines/sass_sm90.json] [--write-baseline FILE] [--out FILE]
    trit bench sass --kernel gemv --config 128,32,1,4 --m 1        # one kernel and config, printed

Each kernel is specialized as a launch on Llama-3-8B's gate_up would specialize
it (bf16 activations, group 64, pointers and sizes divisible by 16, no masks),
with the config the H200's shipped tuned table holds for that problem. Per kernel:
registers a thread and stack bytes (``cuobjdump -res-usage``), and the SASS
instructions of its main loop (the longest backward branch), by opcode and per
unit of work a thread (a word of 16 weights for the GEMV, a weight for the
tensor-core kernels, a word for the dequantize). It uses the ``ptxas`` and
``cuobjdump`` that ship with triton, so the counts are those of the installed
triton: a CPU can guard them exactly (the figures of the regression guard,
:mod:`trit.bench.guard`; a baseline of another triton is refused). The CUDA C++
kernels of the mma layout (``trit.kernels.cuda``) are compiled with NVRTC at
the config the H200's table holds for that problem (their heuristic's where
it holds none), where NVRTC is installed; its version is then one of the
versions a baseline must match.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from trit.bench.guard import DEFAULT_TOLERANCE, Figure, Report, check

TABLE_OF = "NVIDIA H200"  # the GPU whose shipped table gives the configs compiled (sm_90)

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# the problem every kernel is specialized for: Llama-3-8B's gate_up, group 64, bf16
N, K, GROUP = 28672, 4096, 64
# kernel -> the M its table entry is keyed at (the rows it runs with)
KERNELS = {"gemv": 1, "skinny": 16, "gemm": 64, "dequant": 2048, "gemm_a8": 512}
CUDA_KERNELS = {"cuda_gemv": 1, "cuda_mma": 16, "cuda_wgmma": 128}  # the CUDA C++ kernels, compiled with NVRTC
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)")
COMMON = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*bf16",
          "ws_ptr": "*fp32", "lock_ptr": "*i32"}


def _problem(kernel: str, fields: list[int], m: int):
    """(jit function, signature, constexprs, divisible args, options, a thread's share of a loop trip, its unit)."""
    from trit.kernels.triton import dequant, gemm, gemm_a8, gemv, skinny

    if kernel == "gemv":
        cfg = gemv.GemvConfig(*fields)
        sig = dict(COMMON, M="i32", N="i32", KW="i32", G="i32", stride_xm="i32", one_bits="i32")
        consts = {"GROUP_W": GROUP // 16, "HAS_BIAS": False, "M_ROWS": m, "BLOCK_N": cfg.block_n,
                  "BLOCK_KW": cfg.block_kw, "SPLIT_K": cfg.split_k, "EVEN": True, "PTX": True,
                  "SCALE_MODE": gemv.scale_mode(GROUP, cfg.block_kw)}
        per_trip = cfg.block_n * cfg.block_kw // (32 * cfg.num_warps)
        return (gemv._gemv_kernel, sig, consts, ["N", "KW", "G", "stride_xm", "one_bits"],
                {"num_warps": cfg.num_warps}, per_trip, "word")
    if kernel == "skinny":
        cfg = skinny.SkinnyConfig(*fields)
        sig = dict(COMMON, M="i32", N="i32", K="i32", KW="i32", G="i32", stride_xm="i32")
        consts = {"GROUP_K": GROUP, "HAS_BIAS": False, "BLOCK_M": skinny.block_m(m), "BLOCK_N": cfg.block_n,
                  "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k, "STEPS": cfg.steps, "EVEN": True, "INTERPRET": False}
        per_trip = cfg.block_n * cfg.block_k * cfg.steps // (32 * cfg.num_warps)
        return (skinny._skinny_kernel, sig, consts, ["N", "K", "KW", "G", "stride_xm"],
                {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, per_trip, "weight")
    if kernel == "gemm":
        cfg = gemm.GemmConfig(*fields)
        sig = dict(COMMON, M="i32", N="i32", K="i32", KW="i32", G="i32", stride_xm="i32")
        consts = {"GROUP_K": GROUP, "HAS_BIAS": False, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                  "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m, "SPLIT_K": cfg.split_k, "EVEN": True,
                  "INTERPRET": False}
        per_trip = cfg.block_n * cfg.block_k // (32 * cfg.num_warps)
        return (gemm._gemm_kernel, sig, consts, ["N", "K", "KW", "G", "stride_xm"],
                {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, per_trip, "weight")
    if kernel == "dequant":
        cfg = dequant.DequantConfig(*fields)
        sig = {"w_ptr": "*i32", "s_ptr": "*fp16", "out_ptr": "*bf16", "N": "i32", "K": "i32", "KW": "i32", "G": "i32"}
        consts = {"GROUP_W": GROUP // 16, "BLOCK_N": cfg.block_n, "BLOCK_KW": cfg.block_kw, "INTERPRET": False,
                  "K_FASTEST": cfg.k_fastest}
        per_trip = cfg.block_n * cfg.block_kw // (32 * cfg.num_warps)
        return (dequant._dequant_kernel, sig, consts, ["N", "K", "KW", "G"], {"num_warps": cfg.num_warps},
                per_trip, "word")
    cfg = gemm_a8.GemmA8Config(*fields)
    sig = {"q_ptr": "*i8", "sx_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "KW": "i32", "G": "i32"}
    consts = {"GROUP_K": GROUP, "HAS_BIAS": False, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m}
    per_trip = cfg.block_n * cfg.block_k // (32 * cfg.num_warps)
    return (gemm_a8._gemm_a8_kernel, sig, consts, ["N", "K", "KW", "G"],
            {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, per_trip, "weight")


def loop_ops(sass: str, work: str | None = None) -> collections.Counter:
    """Opcodes of the longest loop: from a backward branch's target to the branch (a kernel with no loop, such
    as the dequantize, which runs one step a program: every instruction but the trailing padding). With
    ``work`` (an opcode), the shortest span that holds it: the innermost loop doing the work, where nvcc's
    layout also leaves backward branches around the barriers of the prologue and the epilogue."""
    lines = [(int(mt.group(1), 16), mt.group(2), ln) for ln in sass.splitlines() if (mt := LINE.match(ln))]
    best: list = []
    for addr, op, ln in lines:
        target = re.search(r"0x([0-9a-f]+)", ln.split("BRA", 1)[1]) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [o for a, o, _ in lines if int(target.group(1), 16) <= a <= addr]
            if work is None:
                best = body if len(body) > len(best) else best
            elif work in body and (not best or len(body) < len(best)):
                best = body
    if not best:
        best = [o for _, o, _ in lines if o != "NOP"]
        while best and best[-1] == "BRA":  # the self-branch after EXIT
            best.pop()
    return collections.Counter(best)


def disassemble(cubin_bytes: bytes) -> tuple[str, str]:
    """``cuobjdump``'s resource usage and SASS of a cubin."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        Path(cubin).write_bytes(cubin_bytes)
        usage = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
    return usage, sass


def compile_one(kernel: str, fields: list[int], m: int) -> dict:
    fn, sig, consts, div, opts, per_trip, unit = _problem(kernel, fields, m)
    for name in consts:
        sig[name] = "constexpr"
    ptrs = [a for a, t in sig.items() if t.startswith("*")]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in [*ptrs, *div]}
    compiled = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    return measure(compiled.asm["cubin"], kernel, fields, m, per_trip, unit)


def function_sass(sass: str, name: str | None) -> str:
    """The SASS of function ``name`` (a mangled name) of a cubin's disassembly; all of it for ``None``."""
    if name is None:
        return sass
    parts = re.split(r"\n\s*Function : ", sass)
    found = [p for p in parts[1:] if p.split("\n", 1)[0].strip() == name]
    assert found, f"no function {name} in the cubin"
    return found[0]


def measure(cubin: bytes, kernel: str, fields: list[int], m: int, per_trip: int, unit: str,
            function: str | None = None, work: str | None = None) -> dict:
    """A compiled kernel's row: registers, stack and main-loop instructions, also per ``unit`` a thread.

    ``function``: the (mangled) name of the kernel, where the cubin holds others (their addresses overlap);
    ``work``: the opcode of its main loop's work (see :func:`loop_ops`)."""
    usage, sass = disassemble(cubin)
    ops = loop_ops(function_sass(sass, function), work)
    total = sum(ops.values())
    return {"kernel": kernel, "config": fields, "m": m,
            "registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack_bytes": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "loop_instructions": total,
            "per_thread_per_trip": per_trip, "unit": unit,
            "loop_instructions_per_unit": total / per_trip,
            "loop_opcodes": dict(ops.most_common())}


def nvrtc_version() -> str | None:
    """NVRTC's version (``"13.5"``), or None where it is not installed."""
    from trit.kernels.cuda import nvrtc

    try:
        major, minor = nvrtc.version()
    except nvrtc.CudaUnavailable:
        return None
    return f"{major}.{minor}"


def compile_cuda(kernel: str, m: int) -> dict:
    """A CUDA C++ kernel at the config a launch on gate_up at ``m`` rows takes on an H200: its shipped table's, else
    its heuristic's."""
    import dataclasses

    import torch

    from trit.kernels import tuning
    from trit.kernels.cuda import gemv, mma, nvrtc, wgmma

    key = tuning.key(m, N, K, GROUP, torch.bfloat16)
    arch = "sm_90"
    if kernel == "cuda_wgmma":
        cfg = tuning.shipped_lookup(TABLE_OF, kernel, key, wgmma.WgmmaConfig) or wgmma.heuristic(m, mma.shape_only(N, K, GROUP), sms=132)
        name, source, arch = wgmma.kernel_name(cfg, GROUP), wgmma.source(), "sm_90a"
        per_trip = cfg.rt * cfg.ki * 4 * 16  # a lane's weights a chunk, as the mma kernel's
        work = "HGMMA"
    elif kernel == "cuda_mma":
        cfg = tuning.shipped_lookup(TABLE_OF, kernel, key, mma.MmaConfig) or mma.heuristic(m, *mma.tiles(N, K), sms=132)  # an H200
        name, source = mma.kernel_name(mma.token_tiles(m, cfg.mt), cfg, GROUP), mma.source()
        per_trip = cfg.rt * cfg.ki * 4 * 16  # a lane's weights a chunk: rt tiles x ki steps x 4 words of 16
        work = "HMMA"
    else:
        assert kernel == "cuda_gemv", kernel
        cfg = tuning.shipped_lookup(TABLE_OF, kernel, key, gemv.GemvConfig) or gemv.heuristic(m, *mma.tiles(N, K), sms=132)
        name, source = gemv.kernel_name(gemv.token_slots(m), cfg, GROUP), gemv.source()
        per_trip = (cfg.pf + 1) * cfg.rt * 4 * 16  # a lane's weights a trip: pf + 1 steps x rt tiles x 4 words of 16
        work = "IDP"
    cubin, lowered, _ = nvrtc.compile_cubin(source, name, arch)
    fields = [int(v) for v in dataclasses.astuple(cfg)]
    return measure(cubin, kernel, fields, m, per_trip, "weight", lowered, work)


def shipped_config(kernel: str) -> list[int]:
    """The config the H200's shipped table holds for gate_up at the kernel's M (its default where none)."""
    import dataclasses

    import torch

    from trit.kernels import tuning
    from trit.kernels.triton import dequant, gemm, gemm_a8

    key = tuning.key(KERNELS[kernel], N, K, GROUP, torch.bfloat16)
    types = {"gemv": "GemvConfig", "skinny": "SkinnyConfig", "gemm": "GemmConfig"}
    if kernel in types:
        from trit.kernels.triton import gemv, skinny

        module = {"gemv": gemv, "skinny": skinny, "gemm": gemm}[kernel]
        cfg = tuning.shipped_lookup(TABLE_OF, f"triton_{kernel}", key, getattr(module, types[kernel]))
        if cfg is None:
            cfg = (module.default_config(N, K, KERNELS[kernel]) if kernel == "gemv"
                   else module.default_config(KERNELS[kernel], N, K, GROUP))
    elif kernel == "dequant":
        cfg = dequant.DEFAULT
    else:
        cfg = gemm_a8.default_config(KERNELS[kernel], N, K, GROUP)
    return [int(v) for v in dataclasses.astuple(cfg)]


def report() -> Report:
    """Every shipped kernel at its shipped config: registers and loop instructions a unit of work."""
    nvrtc = nvrtc_version()
    versions = {"triton": triton.__version__, **({"nvrtc": nvrtc} if nvrtc else {})}
    rep = Report("sass", "sm_90 (offline compile)", versions, command="trit bench sass")
    if not nvrtc:
        print("NVRTC is not installed: the CUDA C++ kernels are left out", flush=True)
    runs = [(k, m, lambda k=k, m=m: compile_one(k, shipped_config(k), m)) for k, m in KERNELS.items()]
    runs += [(k, m, lambda k=k, m=m: compile_cuda(k, m)) for k, m in CUDA_KERNELS.items() if nvrtc]
    for kernel, m, run in runs:
        r = run()
        label, config = f"{kernel} M={m}", ",".join(map(str, r["config"]))
        rep.figures[f"{label}: registers"] = Figure(r["registers"], f"registers a thread (config {config})")
        rep.figures[f"{label}: loop instructions"] = Figure(round(r["loop_instructions_per_unit"], 3),
                                                            f"SASS instructions a {r['unit']} a thread (config {config})")
        print(f"{label} ({config}): {r['registers']} registers, loop {r['loop_instructions']} instructions, "
              f"{r['loop_instructions_per_unit']:.2f} a {r['unit']}", flush=True)
    return rep


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trit bench sass", description=__doc__.split("\n\n")[0], add_help=add_help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--kernel", choices=list(KERNELS), help="one kernel only, printed (with --config)")
    ap.add_argument("--config", action="append", default=[], help="its config fields, comma-separated (repeatable)")
    ap.add_argument("--m", type=int, default=None, help="activation rows (default: the kernel's table M)")
    ap.add_argument("--baseline", type=Path, default=None, help="compare with this baseline; exit 1 on a regression")
    ap.add_argument("--write-baseline", type=Path, default=None, help="record this run as a baseline")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed rise, relative")
    ap.add_argument("--out", type=Path, help="write the rows (with opcodes) as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.kernel:
        m = a.m or KERNELS[a.kernel]
        rows = [compile_one(a.kernel, [int(v) for v in c.split(",")], m) for c in a.config or
                [",".join(map(str, shipped_config(a.kernel)))]]
        for r in rows:
            print(f"{a.kernel} {','.join(map(str, r['config']))}: {r['registers']} registers, stack "
                  f"{r['stack_bytes']}, loop {r['loop_instructions']} instructions, "
                  f"{r['loop_instructions_per_unit']:.1f} a {r['unit']}; top: {dict(list(r['loop_opcodes'].items())[:8])}")
        if a.out:
            a.out.write_text(json.dumps({"command": sys.argv, "triton": triton.__version__, "rows": rows}, indent=1))
        return 0
    return check(report(), a.baseline, a.write_baseline, a.tolerance)
