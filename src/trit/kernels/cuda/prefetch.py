"""L2 prefetch across the attention gap (opt-in: ``TRIT_PREFETCH_MB``).

At a decode step of a few tokens, each layer's attention input projection
(``qkv_proj``, or ``v_proj`` where q, k and v are separate) is followed by
attention, which reads little memory, and then by the output projection and
the MLP's first layer, which read the most. The ternary weights are small
enough for the L2 to hold a good share of what comes next (Llama-3-8B's
o_proj is 4.7 MB, its gate_up_proj 33 MB; the H100's L2 is 50 MB). With a
budget set, every CUDA kernel of the mma layout that runs an attention input
projection asks the L2, once its own work is done, for the first
``TRIT_PREFETCH_MB`` megabytes of the layers loaded after it (their scales,
then their codes, in load order), so that those lines arrive while attention
runs. It is a hint: no result depends on it, and the kernel does not wait for
it (``l2_prefetch`` in ``common.cuh``).

Layers are linked as they load, in the order the model holds them, which is
the order they run in (:func:`loaded`: the vLLM plugin's
``process_weights_after_loading``; :func:`link_model` for the runtime): a
source keeps taking the layers after it until the budget is spent or the next
source loads. Each source's ranges sit in a small int64 table on its GPU,
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
# the last projection before attention, by the module's own name: vLLM's fused qkv_proj, the separate q, k, v
# projections of transformers' models (v_proj loads last), GPT-NeoX's and Falcon's query_key_value, GPT-2's
# c_attn, Baichuan's W_pack
ATTENTION_INPUTS = ("qkv_proj", "v_proj", "query_key_value", "c_attn", "W_pack")
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
    if mb < 0:
        raise ValueError(f"{ENV}={raw!r}: expected megabytes to prefetch into the L2 (0 or more)")
    return int(mb * 2**20)


def is_source(name: str) -> bool:
    """Whether the layer ``name`` (its module path) is the last projection before attention."""
    return name.rpartition(".")[2] in ATTENTION_INPUTS


@dataclass
class _Source:
    codes: weakref.ref  # the source's codes (the kernel's ``wq``), not kept alive by the link
    device: torch.device
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
    codes = src.codes()
    if codes is None:  # the source went before its targets loaded
        return
    key = codes.data_ptr()
    flat = [len(src.ranges)] + [v for r in src.ranges for v in r]
    _TABLES[key] = torch.tensor(flat, dtype=torch.int64, device=src.device)
    _KEEP[key] = list(src.keep)
    weakref.finalize(codes, _forget, key, _TABLES[key])


def _forget(key: int, t: torch.Tensor) -> None:
    global _pending
    if _TABLES.get(key) is t:  # a later layer at the same address has its own table: keep that one
        del _TABLES[key], _KEEP[key]
    if _pending is not None and _pending.codes() is None:  # nor does the chain keep the source's targets
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
    for each trit-plane). It becomes a target of the pending source, within that source's budget, and, where it is
    an attention input projection running the CUDA kernels, the next source."""
    global _pending
    budget = budget_bytes() if budget is None else budget
    if budget <= 0:
        return
    if _pending is not None and not is_source(name):
        _add_targets(_pending, tensors)
        if _pending.left < LINE:
            _pending = None
    if is_source(name):
        _pending = None
        if codes is not None:  # on the CPU (TRIT_LAYOUT=mma) the table is made and never read
            _pending = _Source(weakref.ref(codes), codes.device, budget)


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
        src.keep.append(t)
        src.left -= nbytes
        added = True
    if added:
        _publish(src)


def link_model(model: torch.nn.Module, budget: int | None = None) -> int:
    """Link a loaded model's ternary layers in module order (the runtime's loader, after :func:`trit.nn.tile`;
    another model's links stay): returns the number of its layers that got a table."""
    from trit.nn import TritLinear

    global _pending
    _pending = None
    linked = 0
    for name, mod in model.named_modules():
        if isinstance(mod, TritLinear):
            codes, tensors = layer_tensors(mod)
            loaded(name, codes, tensors, budget)
    for mod in model.modules():
        if isinstance(mod, TritLinear):
            codes, _ = layer_tensors(mod)
            linked += codes is not None and codes.data_ptr() in _TABLES
    _pending = None
    return linked


def layer_tensors(mod) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """A :class:`trit.nn.TritLinear`'s first plane codes in the mma layout (``None`` in format v1), and what its
    kernels read, scales before codes for each plane."""
    planes = mod.planes_for_forward()
    tensors: list[torch.Tensor] = []
    codes = None
    for p in planes:
        if hasattr(p, "wq"):
            tensors += [p.sc, p.wq]
            codes = codes if codes is not None else p.wq
        else:
            packed, scale = p
            tensors += [scale, packed]
    return codes, tensors
