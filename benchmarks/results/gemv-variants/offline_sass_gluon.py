"""``benchmarks/offline_sass.py`` for ``gluon_gemv.py``: compile it for sm_90 without a GPU (its ``STAGES``, ``SD``
and ``TILED`` from the environment, as the file reads them) and count what its loop issues, a word a thread.

    PYTHONPATH=src python3 benchmarks/results/gemv-variants/offline_sass_gluon.py 128,32,1,4 32,32,1,1 \\
        --out benchmarks/results/gemv-variants/sass_gluon_triton36.json

Run it with triton 3.6 installed (the H200 machine's), as ``offline_sass.py`` says.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))
from offline_sass import COMMON, disassemble, loop_ops  # noqa: E402
from sweep import load  # noqa: E402  this folder's


def compile_one(g, fields: list[int], m: int) -> dict:
    bn, bkw, sk, nw = fields
    fn = g._gemv_kernel
    sig = dict(COMMON, M="i32", N="i32", KW="i32", G="i32", stride_xm="i32")
    consts = {"STAGES": g.STAGES, "SD": g.SD, "TILED": g.TILE, "GROUP_W": 4, "HAS_BIAS": False, "M_ROWS": m,
              "BLOCK_N": bn, "BLOCK_KW": bkw, "SPLIT_K": sk, "EVEN": True, "SCALE_MODE": g.scale_mode(64, bkw)}
    if "NST" in fn.arg_names:  # the prologue patch: steps a share, for K = 4096 (256 words)
        consts["NST"] = triton.cdiv(256, sk * bkw)
    for name in consts:
        sig[name] = "constexpr"
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in [*COMMON, "N", "KW", "G", "stride_xm"]}
    compiled = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": nw})
    usage, sass = disassemble(compiled.asm["cubin"])
    ops = loop_ops(sass)
    per_trip = bn * bkw // (32 * nw)
    return {"config": fields, "m": m, "stages": g.STAGES, "sd": g.SD, "tiled": g.TILE,
            "registers": int(usage.split("REG:")[1].split()[0]), "loop_instructions": sum(ops.values()),
            "words_per_thread_per_trip": per_trip, "loop_instructions_per_word": sum(ops.values()) / per_trip,
            "loop_opcodes": dict(ops.most_common())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--file", type=Path, default=HERE / "gluon_gemv.py", help="a patched copy, e.g.")
    a = ap.parse_args()
    g = load(a.file, "gluon_gemv")
    rows = [compile_one(g, [int(v) for v in c.split(",")], a.m) for c in a.configs]
    for r in rows:
        print(f"{r['config']}: {r['registers']} registers, loop {r['loop_instructions']} instructions, "
              f"{r['loop_instructions_per_word']:.1f} a word")
    if a.out:
        env = {k: os.environ[k] for k in ("STAGES", "SD", "TILED") if k in os.environ}
        a.out.write_text(json.dumps({"command": sys.argv, "env": env, "triton": triton.__version__, "rows": rows},
                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
