"""The CUDA C++ candidates of :func:`trit.kernels.registry.choose_kernel`, on the load-time mma layout.

A layer is held in one layout. Where :func:`tile_refusal` finds nothing against
it, the runtime and the vLLM plugin repack each layer once, at load
(:func:`trit.kernels.cuda.mma.repack`), and the layer's forward calls
``trit::linear_tiled``; these kernels take it from there: the dp2a GEMV for a
few rows (or the int8 tensor-core GEMV up to 32, where the tuned table measured it faster), the mma.sync GEMM up to 64 rows (on Hopper, up to 63: the wgmma GEMM
takes 64 to 256), each further where the tuned table measured it faster, and
dequantize + cuBLAS above. Each
refusal says why, as the Triton candidates' do. Where NVRTC cannot compile
(no CUDA build of torch, no ``nvidia-cuda-nvrtc``), nothing is repacked and
the Triton kernels read format v1 as before: the reason is logged once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch

from trit.kernels import tuning
from trit.kernels.cuda import gemv, imma, mma, wgmma

log = logging.getLogger(__name__)

# without a tuned choice (the table's "choice_mma"), the GEMV takes up to this many rows, the mma kernel up to
# mma.MAX_M, dequantize + cuBLAS the rest; with one, the kernel it names (the mma kernel at any M)
GEMV_MAX_M = 4
# "auto" (the default): the mma layout where the CUDA kernels run it; "v1": keep the checkpoint's layout;
# "mma": the mma layout wherever it can hold the layer, on any device (elsewhere than the CUDA kernels run, the
# plain-PyTorch reference computes it: slow, for tests of the layout's path)
LAYOUT_ENV = "TRIT_LAYOUT"
# under "auto", layers smaller than this stay in format v1. On the H200, every layer of the three benchmark
# shapes in both layouts, each tuned, times summed over M = 1, 4, 16, 64, 128, 256
# (benchmarks/results/kernels_every_layer_mma.json): the mma layout (with the wgmma kernel) won on every layer
# of 21Mi weights or more (Llama-3-8B's qkv, 24Mi: 117 against 125 us; the 27B shape's o, 21Mi; Qwen2-1.5B's
# gate_up, 26Mi: 117 against 135 us) and lost or tied below (Llama's o, 16Mi: 95 against 92 us; Qwen2-1.5B's
# down, 13Mi, a tie; its qkv and o, 3Mi and 2Mi, lost at M <= 16)
TILE_MIN_WEIGHTS = 20 * 2**20
# and layers of fewer inputs than this stay too: with K = 1536 the mma layout lost on each Qwen2-1.5B layer of that K
# at M = 1 and 4 in that run, and a Qwen2-1.5B vLLM server with its gate_up (26Mi, K = 1536) in the mma layout
# streamed x0.74 as fast as bf16 at concurrency 16 (TPOT 3.05 against 2.26 ms; x0.99 with every layer in
# format v1), benchmarks/results/experiments/qwen2-1.5b_gate_up_mma_h200.json
TILE_MIN_K = 2048


@functools.cache
def unavailable() -> str | None:
    """Why the CUDA kernels cannot run in this process (``None``: they can)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    from trit.kernels.cuda import nvrtc

    try:
        nvrtc.nvrtc()
        nvrtc.driver()
    except nvrtc.CudaUnavailable as e:
        return str(e)
    return None


def tile_refusal(device: torch.device, dtype: torch.dtype, group_size: int, in_features: int,
                 act_int8: bool, out_features: int | None = None) -> str | None:
    """Why a layer on ``device`` running in ``dtype`` stays in format v1 (``None``: repack it to the mma layout).

    ``out_features`` given: a layer of fewer than :data:`TILE_MIN_WEIGHTS` weights, or of fewer than
    :data:`TILE_MIN_K` inputs, stays too (``auto`` only)."""
    wanted = os.environ.get(LAYOUT_ENV, "auto") or "auto"
    if wanted not in ("auto", "mma", "v1"):
        raise ValueError(f"{LAYOUT_ENV}={wanted!r}: expected 'auto', 'mma' or 'v1'")
    if wanted == "v1":
        return f"{LAYOUT_ENV}=v1"
    if act_int8:
        return "int8 activations (W1.58A8) go through the Triton int8 kernels, which read format v1"
    if group_size not in mma.GROUPS:
        return f"group size {group_size}: the mma layout takes {mma.GROUPS}"
    if in_features % 8:
        return f"K = {in_features} is not a multiple of 8"
    if wanted == "mma":
        return None
    if device.type != "cuda":
        return f"the mma layout's kernels run on CUDA, not {device.type}"
    if dtype != torch.bfloat16:
        return f"the mma layout's kernels take bf16 activations, not {str(dtype).removeprefix('torch.')}"
    if out_features is not None and out_features * in_features < TILE_MIN_WEIGHTS:
        return (f"{out_features} x {in_features} weights: below {TILE_MIN_WEIGHTS // 2**20}Mi, format v1's Triton "
                "kernels are as fast or faster (benchmarks/results/kernels_every_layer_mma.json)")
    if out_features is not None and in_features < TILE_MIN_K:
        return (f"K = {in_features} < {TILE_MIN_K}: format v1's Triton kernels served faster "
                "(benchmarks/results/experiments/qwen2-1.5b_gate_up_mma_h200.json)")
    why = unavailable()
    if why is not None:
        _log_once(why)
    return why


@functools.cache
def _log_once(why: str) -> None:
    log.warning("trit: layers stay in format v1 for the Triton kernels: %s", why)


def _refusal(p, max_m: int, what: str) -> str | None:
    if p.device_type != "cuda":
        return f"runs on CUDA, not {p.device_type}"
    if p.dtype != torch.bfloat16:
        return f"takes bf16 activations, not {str(p.dtype).removeprefix('torch.')}"
    if p.act_int8:
        return "no int8-activation path"
    if p.m > max_m:
        return f"M = {p.m} > {max_m}: {what}"
    if p.k % 8:
        return f"K = {p.k} is not a multiple of 8"
    return unavailable()


def _choice(p) -> str | None:
    """The mma-layout kernel the tuned table measured fastest for this problem, if it holds one and that kernel
    can take the problem here: on a GPU without a table of its own the H200's is read, so on one without wgmma,
    or with the kernel switched off, its choice is passed over and the rules decide, rather than sending the
    layer past every kernel the table did not name."""
    choice = tuning.preferred(tuning.key(p.m, p.n, p.k, p.group_size, p.dtype), "choice_mma")
    return choice if choice is None or _usable(choice, p) else None


def _usable(name: str, p) -> bool:
    if name in tuning.disabled():
        return False
    if name == "cuda_wgmma":
        return _wgmma_support(torch.cuda.current_device()) is None
    if name == "cuda_gemv":
        return p.m <= gemv.MAX_M
    if name == "cuda_imma":
        return p.m <= imma.MAX_M
    return True


def _prefers_other(choice: str | None, name: str) -> str | None:
    return None if choice is None or choice == name else f"the tuned table measured {choice} faster for this problem"


def refuse_gemv(p) -> str | None:
    if p.m > gemv.MAX_M:
        return f"M = {p.m} > {gemv.MAX_M}: the GEMV holds at most {gemv.MAX_M} rows"
    choice = _choice(p)
    limit = GEMV_MAX_M if choice is None else gemv.MAX_M
    return _refusal(p, limit, "no tuned choice, and the mma kernel is faster there as a rule") \
        or _prefers_other(choice, "cuda_gemv")


def refuse_imma(p) -> str | None:
    why = _refusal(p, imma.MAX_M, f"it holds at most {imma.MAX_M} tokens")
    if why is not None:
        return why
    choice = _choice(p)
    if choice is None:
        return "no tuned choice: it runs where the tuned table measured it fastest"
    return _prefers_other(choice, "cuda_imma")


def refuse_mma(p) -> str | None:
    choice = _choice(p)
    limit = 1 << 62 if choice == "cuda_mma" else mma.MAX_M
    return _refusal(p, limit, f"no tuned choice of the mma kernel, which takes up to {mma.MAX_M} rows as a rule") \
        or _prefers_other(choice, "cuda_mma")


@functools.cache
def _wgmma_support(device_index: int) -> str | None:
    return wgmma.supported(torch.device("cuda", device_index))


def refuse_wgmma(p) -> str | None:
    why = _refusal(p, 1 << 62, "")
    if why is None:
        why = _wgmma_support(torch.cuda.current_device())
    if why is not None:
        return why
    choice = _choice(p)
    if choice is None and not wgmma.MIN_M <= p.m <= wgmma.MAX_M:
        return f"M = {p.m}: without a tuned choice it takes {wgmma.MIN_M} to {wgmma.MAX_M} rows"
    return _prefers_other(choice, "cuda_wgmma")


def refuse_dequant(p) -> str | None:
    return _refusal(p, 1 << 62, "")


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _finish(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        y = y + bias
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


def _tuned(name: str, x2: torch.Tensor, r: mma.MmaWeights, config_type):
    """The tuned table's config for this problem (``trit bench kernels --tuned-out``), else ``None``: the heuristic."""
    return tuning.lookup(name, tuning.key(x2.shape[0], r.n, r.k, r.group_size, x2.dtype), config_type)


# each problem's launch, worked out on its first call (config, kernel, grid: mma.Plan) and kept until the tuned
# tables change; the host's work a call is then the launch itself (benchmarks/host_path.py measures it)
_PLANS: dict[tuple, mma.Plan] = {}
_PLANS_MAX = 4096  # problems kept (a server sees each token count up to its largest batch once a layer shape)


def _planned(name: str, plan, config_type, x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None):
    x2 = _flat(x)
    mma.check_x(x2, r, name)
    key = (name, x2.shape[0], r.n, r.k, r.group_size, x2.device, tuning.generation())
    p = _PLANS.get(key)
    if p is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        # the kernel is loaded for, and later launched on the stream of, x's GPU, whichever is current
        with torch.cuda.device(x2.device) if x2.is_cuda else contextlib.nullcontext():
            p = _PLANS[key] = plan(x2.shape[0], r, _tuned(name, x2, r, config_type), x2.device)
    return _finish(mma.run(p, x2, r), x, bias)


def run_gemv(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_gemv", gemv.plan, gemv.GemvConfig, x, r, bias)


def run_imma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_imma", imma.plan, imma.ImmaConfig, x, r, bias)


def run_mma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_mma", mma.plan, mma.MmaConfig, x, r, bias)


def run_wgmma(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return _planned("cuda_wgmma", wgmma.plan, wgmma.WgmmaConfig, x, r, bias)


def run_dequant(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, gemv.dequantize(r), bias)


def reference(x: torch.Tensor, r: mma.MmaWeights, bias: torch.Tensor | None) -> torch.Tensor:
    """Any device, any dtype: the layout's dense weight in float32, rounded once to ``x.dtype``."""
    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x.float(), mma.unpack_layout(r), b).to(x.dtype)


def dense(r: mma.MmaWeights, dtype: torch.dtype) -> torch.Tensor:
    """The layer's dense weight (N, K) in ``dtype`` (the backward pass multiplies the gradient by it)."""
    if r.wq.is_cuda and unavailable() is None:
        return gemv.dequantize(r).to(dtype)
    return mma.unpack_layout(r).to(dtype)
