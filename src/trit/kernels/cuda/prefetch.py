"""L2 prefetch across the attention gap (opt-in: ``TRIT_PREFETCH_MB``).

At a decode step of a few tokens, each layer's attention input projection
(``qkv_proj``; where q, k and v are separate, the last of them) is followed by
attention, which reads little memory, and then by the output projection and
the MLP's first layer, which read the most. The ternary weights are small
enough for the L2 to hold a good share of what comes next (Llama-3-8B's
o_proj is 4.7 MB, its gate_up_proj 33 MB; the H100's L2 is 50 MB). With a
budget set, the CUDA kernel of each attention block's last input projection
in the mma layout (a layer ``trit.kernels.cuda.launch.tile_refusal`` keeps in
format v1, such as a tensor-parallel shard under 20Mi weights, cannot be one)
asks the L2, once its output is written, for the first
``TRIT_PREFETCH_MB`` MiB of the layers loaded after it (their scales,
then their codes, in load order), so that those lines arrive while attention
runs. It is a hint: no result depends on it, and the kernel does not wait for
it (``l2_prefetch`` in ``common.cuh``).

Layers are linked as they load, in the order the model holds them, which is
the order they run in (:func:`loaded`: the vLLM plugin's
``process_weights_after_loading``; :func:`trit.nn.link_prefetch` for the runtime): a
source keeps taking the layers after it until the budget is spent or the next
attention block's projections load. A model whose modules are held in another
order than they run (vLLM and transformers' Llama, Qwen2, Gemma hold them in
order) gets a useless hint, never a wrong result. Each source's ranges sit in a small int64 table on its GPU,
keyed by the address of its codes (:func:`table_ptr`, read at each launch);
the table keeps its targets alive, and it goes when the source's codes are
freed.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

import torch

ENV = "TRIT_PREFETCH_MB"
# the projections attention reads, by the module's own name: vLLM's fused qkv_proj, the separate q, k, v
# projections of transformers' models, GPT-NeoX's and Falcon's query_key_value, GPT-2's c_attn, Baichuan's W_pack,
# MPT's and InternLM2's Wqkv / wqkv, OLMo's att_proj. Of an attention block's, the last that runs the CUDA
# kernels is the source.
ATTENTION_INPUTS = ("qkv_proj", "q_proj", "k_proj", "v_proj", "query_key_value", "c_attn", "W_pack", "Wqkv", "wqkv",
                    "att_proj")
LINE = 128  # bytes a prefetch asks for
# the kernels of a layer that prefetches are compiled with this; every other layer runs them without it
OPTIONS = ("-DTRIT_L2_PREFETCH",)


def budget_bytes() -> int:
    """``TRIT_PREFETCH_MB`` in bytes (unset, empty or 0: off)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected megabytes to prefetch into the L2 (a number; 0 turns it off)") \
            from None
    if not mb < float("inf") or mb < 0:  # nan, inf
        raise ValueError(f"{ENV}={raw!r}: expected megabytes to prefetch into the L2 (0 or more)")
    return int(mb * 2**20)


def is_source(name: str) -> bool:
    """Whether the layer ``name`` (its module path) is a projection attention reads (a source where it runs the
    CUDA kernels and no later one of its block does)."""
    return name.rpartition(".")[2] in ATTENTION_INPUTS


@dataclass
class _Source:
    key: int  # the address of the source's codes (the kernel's ``wq``); the link does not keep them alive
    device: torch.device
    block: str  # the attention block's module path
    left: int  # bytes of budget not yet given to a range
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes)
    keep: list[torch.Tensor] = field(default_factory=list)  # the targets' tensors, alive while the table is


_TABLES: dict[int, torch.Tensor] = {}  # a source's codes address -> its int64 table on its GPU
_KEEP: dict[int, list[torch.Tensor]] = {}
_pending: _Source | None = None


def table_ptr(codes: torch.Tensor) -> int:
    """The device address of the prefetch table of the layer whose codes are ``codes`` (0: none)."""
    if not _TABLES:  # off, or nothing linked: no lookup at each launch
        return 0
    table = _TABLES.get(codes.data_ptr())
    return 0 if table is None else table.data_ptr()


def table(codes: torch.Tensor) -> list[tuple[int, int]]:
    """The ranges (address, bytes) the layer whose codes are ``codes`` prefetches (empty: none)."""
    t = _TABLES.get(codes.data_ptr())
    if t is None:
        return []
    flat = t.tolist()
    return [(flat[1 + 2 * i], flat[2 + 2 * i]) for i in range(flat[0])]


def _publish(src: _Source) -> None:
    flat = [len(src.ranges)] + [v for r in src.ranges for v in r]
    _TABLES[src.key] = torch.tensor(flat, dtype=torch.int64, device=src.device)
    _KEEP[src.key] = src.keep


def _forget(key: int) -> None:
    """The source's codes are freed: its table goes, and the chain does not keep its targets either."""
    global _pending
    _TABLES.pop(key, None)
    _KEEP.pop(key, None)
    if _pending is not None and _pending.key == key:
        _pending = None


def end_chain() -> None:
    """No source pending: the layers loaded next prefetch nothing until an attention block's (a new model)."""
    global _pending
    _pending = None


def reset() -> None:
    """Forget every link (tests; a process that loads a second model starts its chain afresh)."""
    global _pending
    _TABLES.clear()
    _KEEP.clear()
    _pending = None


def loaded(name: str, codes: torch.Tensor | None, tensors: list[torch.Tensor], budget: int | None = None) -> None:
    """A layer has loaded, in model order: ``name`` its module path, ``codes`` its mma-layout codes where its CUDA
    kernels run it (``None``: it cannot be a source), ``tensors`` what its kernels read (scales first, then codes,
    for each trit-plane). A layer attention reads that has codes becomes the pending source (the last of its block
    wins; one without codes leaves its block's source pending); any other layer becomes a target of the pending
    source, within that source's budget."""
    global _pending
    budget = budget_bytes() if budget is None else budget
    if budget <= 0:
        return
    if is_source(name):
        block = name.rpartition(".")[0]
        if codes is not None:  # on the CPU (TRIT_LAYOUT=mma) the table is made and never read
            _pending = _Source(codes.data_ptr(), codes.device, block, budget)
            weakref.finalize(codes, _forget, _pending.key)
        elif _pending is not None and _pending.block != block:
            _pending = None  # the next block's attention: the last source's targets end here
        return
    if _pending is not None:
        _add_targets(_pending, tensors)
        if _pending.left < LINE:
            _pending = None


def _add_targets(src: _Source, tensors: list[torch.Tensor]) -> None:
    added = False
    for t in tensors:
        if t.device != src.device or src.left < LINE:
            continue
        start = t.data_ptr() // LINE * LINE  # the line holding the first byte
        nbytes = min(t.data_ptr() + t.numel() * t.element_size() - start, src.left) // LINE * LINE
        if nbytes <= 0:
            continue
        src.ranges.append((start, nbytes))
        src.keep.append(t.detach())  # the memory, even where a loader later gives the parameter other data
        src.left -= nbytes
        added = True
    if added:
        _publish(src)
