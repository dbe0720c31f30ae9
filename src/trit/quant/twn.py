"""TWN: ternary weight networks, threshold and scale per group minimising the squared error.

For a group w and a threshold t, the best scale is a = mean |w_i| over |w_i| > t,
and the error is sum w^2 - (sum_{|w_i|>t} |w_i|)^2 / #{|w_i| > t} (Li et al. 2016,
"Ternary Weight Networks", arXiv:1605.04711). TWN approximates the best t by
0.7 * mean |w|; here it is found exactly: sort |w| descending, keep the k largest
for the k that maximises (prefix sum)^2 / k.
"""

from __future__ import annotations

import torch

from trit.quant.common import Ternary, grouped

_ROWS_PER_CHUNK = 4096


def quantize_twn(weight: torch.Tensor, group_size: int) -> Ternary:
    w = grouped(weight, group_size)  # (N, G, g) f32
    values = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for start in range(0, w.shape[0], _ROWS_PER_CHUNK):
        rows = slice(start, start + _ROWS_PER_CHUNK)
        values[rows], scales[rows] = _twn_groups(w[rows])
    return Ternary(values.reshape(weight.shape), scales)


def _twn_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, G, g)`` -> int8 values ``(n, G, g)`` and the optimal scales ``(n, G)``."""
    mag, order = w.abs().sort(dim=-1, descending=True)
    prefix = mag.cumsum(dim=-1)  # sum of the k largest, k = 1..g
    k = torch.arange(1, w.shape[-1] + 1, device=w.device, dtype=torch.float32)
    best = (prefix.square() / k).argmax(dim=-1, keepdim=True)  # (n, G, 1): index k* - 1
    scale = prefix.gather(-1, best) / (best + 1).float()
    keep_sorted = torch.arange(w.shape[-1], device=w.device) <= best  # the k* largest
    keep = torch.empty_like(keep_sorted).scatter_(-1, order, keep_sorted)
    values = (torch.sign(w) * keep).to(torch.int8)
    return values, scale.squeeze(-1)
