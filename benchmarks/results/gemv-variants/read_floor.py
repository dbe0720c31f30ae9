"""How fast can a kernel read a layer's packed words with a GEMV's tiling, decoding nothing? (one GPU)

    PYTHONPATH=src python benchmarks/results/gemv-variants/read_floor.py

Two readers, each XOR-folding the words it reads: one with the GEMV's loop
(``BLOCK_N`` rows a program, ``BLOCK_KW`` words a step, the next step's words
loaded while this one folds), one reading a contiguous chunk per program. Times
are CUDA-graph replays over weight copies rotated past the L2, as in
``trit bench kernels``; the fraction is of the copy bandwidth measured in the
same run. The floor says how much of a GEMV's time is memory and how much is
its own work.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from trit.bench.kernels import copies_for, ternary_layer
from trit.kernels import tuning


@triton.jit
def _read_tiles(w_ptr, y_ptr, N, KW, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, PREFETCH: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ptrs = w_ptr + rows[:, None] * KW + tl.arange(0, BLOCK_KW)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_KW), tl.int32)
    words = tl.load(ptrs)
    for kw0 in range(0, KW, BLOCK_KW):
        step = tl.where(kw0 + BLOCK_KW < KW, BLOCK_KW, 0)
        if PREFETCH:
            nxt = tl.load(ptrs + step)
            acc ^= words
            words = nxt
        else:
            acc ^= tl.load(ptrs)
        ptrs += step
    tl.store(y_ptr + rows, tl.sum(acc, axis=1))


@triton.jit
def _read_flat(w_ptr, y_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    base = tl.program_id(0) * CHUNK
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in range(0, CHUNK, BLOCK):
        acc ^= tl.load(w_ptr + base + i + offs)
    tl.store(y_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def _line(what: str, us: float, nbytes: int, copy_bw: float) -> str:
    gbps = nbytes / us / 1e3
    return f"{what}: {us:6.2f} us {gbps:6.0f} GB/s ({gbps / copy_bw:.0%} of copy)"


def main() -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / tuning.graph_time_us([functools.partial(dst.copy_, src)]) / 1e3
    print(f"copy {copy_bw:.0f} GB/s")
    for n, k in [(28672, 4096), (4096, 14336)]:
        kw = k // 16
        layers = [ternary_layer(n, k)[0].view(torch.int32) for _ in range(copies_for(n * k // 4, l2))]
        y = torch.empty(n, dtype=torch.int32, device="cuda")
        for bn, bkw, nw, pre in [(128, 32, 4, 1), (64, 32, 4, 1), (64, 64, 4, 1), (16, 256, 4, 1), (32, 128, 4, 1),
                                 (8, 256, 4, 1), (32, 256, 8, 1), (128, 32, 4, 0), (16, 256, 4, 0)]:
            if kw % bkw or n % bn:
                continue
            launch = _read_tiles[(n // bn,)]
            calls = [functools.partial(launch, w, y, n, kw, BLOCK_N=bn, BLOCK_KW=bkw, PREFETCH=pre, num_warps=nw)
                     for w in layers]
            print(_line(f"{n}x{k} tiles {bn}x{bkw} warps {nw} prefetch {pre}", tuning.graph_time_us(calls),
                        n * kw * 4, copy_bw))
        for chunk, block, nw in [(8192, 1024, 4), (32768, 2048, 8), (4096, 1024, 4)]:
            ys = torch.empty(n * kw // chunk, dtype=torch.int32, device="cuda")
            launch = _read_flat[(n * kw // chunk,)]
            calls = [functools.partial(launch, w, ys, CHUNK=chunk, BLOCK=block, num_warps=nw) for w in layers]
            print(_line(f"{n}x{k} flat chunk {chunk} block {block}", tuning.graph_time_us(calls), n * kw * 4,
                        copy_bw))


if __name__ == "__main__":
    main()
