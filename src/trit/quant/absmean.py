"""absmean: BitNet b1.58's rule, per group.

scale = mean |w| over the group, w_q = clamp(round(w / scale), -1, 1)
(Ma et al. 2024, "The Era of 1-bit LLMs", arXiv:2402.17764, eq. 1-3; there the
group is the whole tensor, here it is ``group_size`` inputs of a row).
"""

from __future__ import annotations

import torch

from trit.quant.common import Ternary, grouped


def quantize_absmean(weight: torch.Tensor, group_size: int, eps: float = 1e-8) -> Ternary:
    w = grouped(weight, group_size)  # (N, G, g) f32
    scale = w.abs().mean(dim=-1, keepdim=True)  # (N, G, 1)
    values = torch.clamp(torch.round(w / (scale + eps)), -1, 1).to(torch.int8)
    return Ternary(values.reshape(weight.shape), scale.squeeze(-1))
