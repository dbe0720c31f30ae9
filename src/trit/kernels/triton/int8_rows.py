"""y = x @ (q * s).T for an int8 matrix ``q`` (N, K) with one float32 scale a row ``s`` (N): the 8-bit lm_head.

The output layer of a ternary model stays a dense matrix, and in a decode step
it is a large share of the bytes read (Llama-3-8B's bf16 head is 1.05 GB, a
third of the model's bytes in trit). Rounded to int8 with one scale a row
(:func:`trit.kernels.int8_rows.quantize_rows`) it reads half of that. Each
program multiplies a block of tokens by a block of rows: int8 codes loaded and
widened to the activation dtype (exact: |q| <= 127), a tensor-core dot in
fp32, the row scale applied once at the end.

Configs first, then the kernel, then the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trit.kernels.triton.codes import interpreting


@dataclass(frozen=True)
class Int8RowsConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def default_config(m: int) -> Int8RowsConfig:
    """Decode batches (M <= 16) read the codes once with long K runs; larger M takes wider token blocks."""
    if m <= 16:
        return Int8RowsConfig(16, 64, 256, 4, 4)
    if m <= 64:
        return Int8RowsConfig(64, 128, 64, 4, 3)
    return Int8RowsConfig(128, 128, 64, 8, 3)


@triton.jit(do_not_specialize=["M"])  # one compile a config, whatever the batch
def _int8_rows_kernel(
    x_ptr,  # (M, K) bf16 / fp16, rows stride_xm apart
    q_ptr,  # (N, K) int8, contiguous
    s_ptr,  # (N,) float32
    y_ptr,  # (M, N) x's dtype
    M, N, K, stride_xm, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # M N passes 2^31 for long prompts' logits
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        q = tl.load(q_ptr + rn[None, :].to(tl.int64) * K + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K),
                    other=0)
        if INTERPRET:  # the CPU interpreter's bf16 dot is wrong: the same values in fp32 there
            acc = tl.dot(x.to(tl.float32), q.to(tl.float32), acc)
        else:
            acc = tl.dot(x, q.to(x.dtype), acc)
    s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
    y = acc * s[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, config: Int8RowsConfig | None = None) -> torch.Tensor:
    """``x`` (M, K) bf16 or fp16 with unit stride along K; ``q`` (N, K) int8 contiguous; ``s`` (N,) float32.
    Returns (M, N) in x's dtype."""
    m, k = x.shape
    n = q.shape[0]
    cfg = config or default_config(m)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _int8_rows_kernel[grid](x, q, s, y, m, n, k, x.stride(0), y.stride(0), BLOCK_M=cfg.block_m,
                            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, INTERPRET=interpreting(), num_warps=cfg.num_warps,
                            num_stages=cfg.num_stages)
    return y
