"""An int8 output layer (lm_head): the weight rounded to int8 with one scale a row, multiplied where it lies.

The opt-in 8-bit head of a trit model (``quantization_config.lm_head = "int8"``,
or ``TRIT_LM_HEAD=int8`` when a model is loaded). Its perplexity cost was
measured before it was built (docs/results.md, "An 8-bit lm_head"), with the
same rounding: symmetric, scale ``max|w| / 127`` a row, round half to even.

- :func:`quantize_rows`: (N, K) float -> int8 codes and float32 row scales.
- :func:`reference`: the plain-PyTorch product, what every fast path is held to.
- :func:`linear`: the product on the codes: Triton's kernel on a CUDA device
  (:mod:`trit.kernels.triton.int8_rows`), the reference elsewhere.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from trit import format as fmt


def head_choice(configured: str) -> str:
    """The output layer a load gives: ``TRIT_LM_HEAD`` (``stored`` or ``int8``) where set, else the checkpoint's
    ``quantization_config.lm_head``."""
    choice = os.environ.get("TRIT_LM_HEAD") or configured
    if choice not in fmt.LM_HEADS:
        raise fmt.FormatError("TRIT_LM_HEAD", f"one of {', '.join(fmt.LM_HEADS)}", repr(choice))
    return choice


ROWS_AT_ONCE = 8192


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` (N, K) -> (int8 codes (N, K), float32 scales (N,)): ``s = max|w_row| / 127``, ``q = round(w / s)``."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"an (N, K) float matrix to round to int8 rows, not {tuple(w.shape)} {w.dtype}")
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    s = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for r in range(0, w.shape[0], ROWS_AT_ONCE):  # float32 copies of a slice at a time, not of the whole head
        wf = w[r: r + ROWS_AT_ONCE].float()
        s[r: r + ROWS_AT_ONCE] = (wf.abs().amax(dim=1) / 127).clamp_min(1e-12)
        q[r: r + ROWS_AT_ONCE] = torch.round(wf / s[r: r + ROWS_AT_ONCE, None]).clamp_(-127, 127).to(torch.int8)
    return q, s


def dequantize_rows(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * s[:, None]).to(dtype)


def reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (q * s).T (+ bias)`` in float32, returned in x's dtype; x (..., K)."""
    y = (x.float() @ q.float().T) * s
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _cpu_int8pack(x2: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """torch's CPU weight-only int8 matmul, with unit scales: the float32 row scales are applied after it, not
    rounded to the activation dtype first."""
    ones = torch.ones(q.shape[0], dtype=x2.dtype)
    return (torch._weight_int8pack_mm(x2, q, ones).float() * s).to(x2.dtype)


def cpu_fast_path(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether torch's CPU int8 matmul takes this product: it needs K a multiple of 8 (elsewhere it returns
    garbage or crashes), and exists in torch 2.4 and later."""
    return (x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and q.shape[1] % 8 == 0 and hasattr(torch, "_weight_int8pack_mm"))


def linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The product on the int8 rows, x (..., K): bf16/fp16 on a CUDA device with Triton goes to the kernel; on
    the CPU, torch's int8 matmul where it applies (:func:`cpu_fast_path`; about ten times the reference's speed
    on SmolLM2's head in bf16); anything else to :func:`reference`."""
    x2 = x.reshape(-1, x.shape[-1])
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        try:
            from trit.kernels.triton import int8_rows
        except ImportError:  # no Triton: the reference
            return reference(x, q, s, bias)
        y = int8_rows.linear(x2 if x2.stride(-1) == 1 else x2.contiguous(), q, s)
    elif cpu_fast_path(x, q):
        y = _cpu_int8pack(x2.contiguous(), q, s)
    else:
        return reference(x, q, s, bias)
    y = y.reshape(*x.shape[:-1], q.shape[0])
    return y if bias is None else y + bias


# one M for each config the Triton kernel takes by default (trit.kernels.triton.int8_rows.default_config; a test
# holds the two together)
WARM_MS = (1, 64, 128)


def warm_up(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> None:
    """On a CUDA device, compile the kernel for each of its token-block configs now, not in a request."""
    if q.is_cuda and dtype in (torch.bfloat16, torch.float16):
        for m in WARM_MS:
            linear(torch.zeros(m, q.shape[1], dtype=dtype, device=q.device), q, s)


class Int8RowsLinear(nn.Module):
    """A linear layer (no bias) on int8 rows: what the runtime puts in place of the output layer."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        q, s = quantize_rows(weight.detach())
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("s", s, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.q, self.s)

    def _apply(self, fn, recurse: bool = True):
        s = self.s
        out = super()._apply(fn, recurse)
        self.s = s.to(self.q.device)  # float32 kept: a cast of the model to bf16 would round every row's scale
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows"
