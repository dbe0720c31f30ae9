"""A rotation of the residual stream, folded into the float weights before they are made ternary.

An orthogonal ``Q`` (hidden x hidden) turns every residual-stream vector ``x``
into ``x Q``; nothing the model computes changes if each weight that reads the
stream reads ``W Q`` and each that writes it writes ``Q^T W`` (QuaRot, Ashkboos
et al. 2024, arXiv:2404.00456; SpinQuant). RMSNorm commutes with ``Q`` once
its weight is folded into the linear layers after it (``W diag(g)``; the norm
keeps a weight of ones). Within attention, each value head is turned by an
orthogonal ``H`` (head_dim x head_dim) in ``v_proj``'s rows and undone in
``o_proj``'s columns. The rotated model is the same function (to rounding), but
its weights are incoherent: outlier rows and channels are spread over all of
them, which is what a grid of three levels a group needs (QuIP, Chee et al.
2023, arXiv:2307.13304). Nothing changes at run time: the checkpoint is an
ordinary trit checkpoint of a model whose weights happen to be rotated.

The cost: the output layer reads the stream through the final norm's weight,
so a model with tied embeddings gets its own ``lm_head`` (``E diag(g) Q``
beside the embeddings' ``E Q``; ``tie_word_embeddings`` becomes false).

``Q`` is random signs times ``O (x) S``: ``S`` the Sylvester-Hadamard matrix
of the largest power of two that divides the hidden size, ``O`` a random
orthogonal matrix of the rest (QR of a Gaussian; 9 x 9 for SmolLM2's 576 =
9 x 64). ``H`` is a signed Sylvester-Hadamard matrix (head_dim a power of
two; a random orthogonal one otherwise). On SmolLM2-135M with 32 calibration
windows this residual rotation measured better than a random orthogonal one
(docs/quantization.md). Pure math and tensor names: tensors in, tensors out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

# the model types whose layers are the plain pre-norm Llama layout this rotation knows (BitNet's norms inside
# attention and the MLP would not commute with it)
ROTATABLE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_READS = {"self_attn.q_proj": "input_layernorm", "self_attn.k_proj": "input_layernorm",
          "self_attn.v_proj": "input_layernorm", "mlp.gate_proj": "post_attention_layernorm",
          "mlp.up_proj": "post_attention_layernorm"}  # linear layer -> the norm before it
_WRITES = ("self_attn.o_proj", "mlp.down_proj")  # the linear layers that write the residual stream
_NORMS = ("input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True)
class Rotation:
    residual: torch.Tensor  # (hidden, hidden) float64, orthogonal
    head: torch.Tensor  # (head_dim, head_dim) float64, orthogonal
    tied: bool  # the source ties lm_head to the embeddings: the rotation writes an lm_head of its own

    def to(self, device: str | torch.device) -> Rotation:
        """The same rotation, its matrices on ``device`` (where :func:`rotate_tensor` then computes)."""
        return Rotation(self.residual.to(device), self.head.to(device), self.tied)


def random_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random orthogonal ``(n, n)`` matrix (Haar: QR of a Gaussian with the signs of R's diagonal)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).contiguous()


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order ``n`` (a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Sylvester-Hadamard matrix has an order that is a power of two, not {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def random_signs(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1


def structured_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    """``diag(signs) (O (x) S)``: ``S`` Sylvester-Hadamard of the largest power of two dividing ``n``, ``O``
    random orthogonal of the odd rest (``n = 576``: 9 x 64)."""
    p = n & -n  # the largest power of two that divides n
    return random_signs(n, gen)[:, None] * torch.kron(random_orthogonal(n // p, gen), hadamard(p))


def make_rotation(config: dict, tied: bool, seed: int = 0) -> Rotation:
    """The rotation of a Llama-family model, from its config.json and a seed; ``tied``: the source has no
    ``lm_head.weight`` of its own."""
    c = config.get("text_config", config)
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    gen = torch.Generator().manual_seed(seed)
    residual = structured_orthogonal(hidden, gen)
    head = random_orthogonal(head_dim, gen) if head_dim & (head_dim - 1) else structured_orthogonal(head_dim, gen)
    return Rotation(residual, head, tied)


def _per_head_rows(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``H^T`` applied to each head's block of rows (the heads' outputs turned by ``H``)."""
    d = h.shape[0]
    return torch.einsum("ji,hj...->hi...", h, w.reshape(-1, d, *w.shape[1:])).reshape(w.shape)


_ROWS = 8192  # rows a float64 product takes at once: the embeddings of a large vocabulary stay in bounds


def _rows_times(t: torch.Tensor, q: torch.Tensor, gains: list[torch.Tensor | None],
                dtype: torch.dtype) -> list[torch.Tensor]:
    """``(t diag(g)) q`` for each ``g`` of ``gains`` (None: no gain) in float64 on ``q``'s device, ``_ROWS`` rows at
    a time (each block of ``t`` moved there once for all of them), into ``dtype`` on ``t``'s."""
    outs = [torch.empty(t.shape[0], q.shape[1], dtype=dtype, device=t.device) for _ in gains]
    for i in range(0, t.shape[0], _ROWS):
        rows = t[i:i + _ROWS].to(q.device, torch.float64)
        for g, out in zip(gains, outs):
            out[i:i + _ROWS] = ((rows if g is None else rows * g) @ q).to(out.device, dtype)
    return outs


def rotate_tensor(rot: Rotation, name: str, tensor: torch.Tensor,
                  norm: Callable[[str], torch.Tensor], head: bool = True) -> dict[str, torch.Tensor]:
    """One source tensor -> its rotated tensors (the embeddings of a tied model also give ``lm_head.weight``,
    unless ``head`` is false).

    ``norm(name)`` reads a norm's weight from the source (folded into the linear layers that read after it).
    Rotated tensors keep the source's dtype and device; the arithmetic is float64, on the rotation's device
    (:meth:`Rotation.to`).
    """
    q, dtype, device = rot.residual, tensor.dtype, tensor.device

    def out(x: torch.Tensor) -> torch.Tensor:
        return x.to(device, dtype).contiguous()

    def gain(norm_name: str) -> torch.Tensor:
        return norm(norm_name).to(q.device, torch.float64)

    if name == "model.embed_tokens.weight":
        if rot.tied and head:  # E Q and the head E diag(g) Q, from one pass over E's rows
            embed, lm_head = _rows_times(tensor, q, [None, gain("model.norm.weight")], dtype)
            return {name: embed, "lm_head.weight": lm_head}
        return {name: _rows_times(tensor, q, [None], dtype)[0]}
    if name == "lm_head.weight":
        return {name: _rows_times(tensor, q, [gain("model.norm.weight")], dtype)[0]}
    if name == "model.norm.weight":
        return {name: torch.ones_like(tensor)}
    m = _LAYER.match(name)
    if m is None:
        return {name: tensor}
    layer, module, leaf = m.groups()
    if module in _NORMS:
        return {name: torch.ones_like(tensor)}
    if module not in _READS and module not in _WRITES:  # e.g. Qwen3's q_norm and k_norm: per head, untouched
        return {name: tensor}
    t = tensor.to(q.device, torch.float64)
    if module in _READS:
        if leaf == "weight":
            t = (t * gain(f"model.layers.{layer}.{_READS[module]}.weight")) @ q
        if module == "self_attn.v_proj":
            t = _per_head_rows(t, rot.head)
        return {name: out(t)}
    # the layers that write the stream (_WRITES); o_proj's columns also undo each value head's turn
    if module == "self_attn.o_proj" and leaf == "weight":
        d = rot.head.shape[0]
        t = (t.reshape(t.shape[0], -1, d) @ rot.head).reshape(t.shape)
    return {name: out(q.T @ t)}


def rotated_config(config: dict) -> dict:
    """config.json of the rotated model: its lm_head is its own."""
    out = dict(config)
    out["tie_word_embeddings"] = False
    if "text_config" in out:
        out["text_config"] = dict(out["text_config"], tie_word_embeddings=False)
    return out


__all__ = ["Rotation", "ROTATABLE_MODEL_TYPES", "make_rotation", "rotate_tensor", "rotated_config", "hadamard",
           "random_orthogonal", "structured_orthogonal"]
