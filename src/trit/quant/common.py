"""What every ternary quantizer returns, and the grouping they share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trit import format as fmt


@dataclass(frozen=True)
class Ternary:
    values: torch.Tensor  # (N, K) int8 in {-1, 0, 1}
    scales: torch.Tensor  # (N, G) float32, G = K // group (1 for group -1)


def grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(N, K)`` -> ``(N, G, g)`` float32 view by groups of consecutive inputs (one group for -1)."""
    n, k = weight.shape
    g = fmt.group_width(group_size, k)
    if k % g:
        raise ValueError(f"K = {k} is not a multiple of the group size {group_size}; pad it first")
    return weight.float().reshape(n, k // g, g)


def dequantize_ternary(t: Ternary) -> torch.Tensor:
    """``(N, K)`` float32: values times their group's scale."""
    return fmt.apply_scales(t.values.float(), t.scales)
