"""Compile the GEMV or the skinny GEMM for sm_90 without a GPU and count what its loop issues.

    PYTHONPATH=src python benchmarks/offline_sass.py gemv 128,32,1,4 32,32,1,1 --out gemv_sass.json
    PYTHONPATH=src python benchmarks/offline_sass.py skinny 128,64,4,4,5,1 --m 16

A config is the kernel's config class's fields, comma-separated. The kernel is
specialized as a launch on Llama-3-8B's gate_up would specialize it (bf16
activations, group 64, pointers and sizes divisible by 16, no masks). For each
config: registers a thread and stack bytes (``cuobjdump -res-usage``), and the
SASS instructions of the kernel's main loop (the longest backward branch),
counted by opcode and per word or weight a thread. It uses the ``ptxas`` and
``cuobjdump`` that ship with triton, so the counts are those of the installed
triton (the H200 machine runs 3.6: install that version to match it).
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

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)")
COMMON = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*bf16",
          "ws_ptr": "*fp32", "lock_ptr": "*i32"}


def _problem(kernel: str, fields: list[int], m: int):
    """(jit function, signature, constexprs, divisible args, options, a thread's share of a loop trip, its unit):
    a GEMV thread's share is counted in words of 16 weights, a skinny thread's in weights."""
    if kernel == "gemv":
        from trit.kernels.triton import gemv

        cfg = gemv.GemvConfig(*fields)
        sig = dict(COMMON, M="i32", N="i32", KW="i32", G="i32", stride_xm="i32", one_bits="i32")
        consts = {"GROUP_W": 4, "HAS_BIAS": False, "M_ROWS": m, "BLOCK_N": cfg.block_n, "BLOCK_KW": cfg.block_kw,
                  "SPLIT_K": cfg.split_k, "EVEN": True, "PTX": True, "SCALE_MODE": gemv.scale_mode(64, cfg.block_kw)}
        div = ["N", "KW", "G", "stride_xm", "one_bits"]
        opts = {"num_warps": cfg.num_warps}
        per_trip = cfg.block_n * cfg.block_kw // (32 * cfg.num_warps)
        return gemv._gemv_kernel, sig, consts, div, opts, per_trip, "word"
    from trit.kernels.triton import skinny

    cfg = skinny.SkinnyConfig(*fields)
    sig = dict(COMMON, M="i32", N="i32", K="i32", KW="i32", G="i32", stride_xm="i32")
    consts = {"GROUP_K": 64, "HAS_BIAS": False, "BLOCK_M": skinny.block_m(m), "BLOCK_N": cfg.block_n,
              "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k, "STEPS": cfg.steps, "EVEN": True, "INTERPRET": False}
    div = ["N", "K", "KW", "G", "stride_xm"]
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    per_trip = cfg.block_n * cfg.block_k * cfg.steps // (32 * cfg.num_warps)
    return skinny._skinny_kernel, sig, consts, div, opts, per_trip, "weight"


def loop_ops(sass: str) -> collections.Counter:
    """Opcodes of the longest loop: from a backward branch's target to the branch."""
    lines = [(int(mt.group(1), 16), mt.group(2), ln) for ln in sass.splitlines() if (mt := LINE.match(ln))]
    best: list = []
    for addr, op, ln in lines:
        target = re.search(r"0x([0-9a-f]+)", ln.split("BRA", 1)[1]) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [o for a, o, _ in lines if int(target.group(1), 16) <= a <= addr]
            best = body if len(body) > len(best) else best
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
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in [*COMMON, *div]}
    compiled = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    usage, sass = disassemble(compiled.asm["cubin"])
    ops = loop_ops(sass)
    total = sum(ops.values())
    return {"kernel": kernel, "config": fields, "m": m,
            "registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack_bytes": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "loop_instructions": total,
            "per_thread_per_trip": per_trip, "unit": unit,
            "loop_instructions_per_unit": total / per_trip,
            "loop_opcodes": dict(ops.most_common())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=["gemv", "skinny"])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--m", type=int, default=1, help="activation rows (the GEMV unrolls 1-4; the skinny pads to 16+)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [compile_one(a.kernel, [int(v) for v in c.split(",")], a.m) for c in a.configs]
    for r in rows:
        print(f"{a.kernel} {','.join(map(str, r['config']))}: {r['registers']} registers, stack {r['stack_bytes']}, "
              f"loop {r['loop_instructions']} instructions, {r['loop_instructions_per_unit']:.1f} a {r['unit']}; "
              f"top: {dict(list(r['loop_opcodes'].items())[:8])}")
    if a.out:
        a.out.write_text(json.dumps({"command": sys.argv, "triton": triton.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
