"""Trit-planes: a weight as a sum of ternary planes, ``W ~ a1 * T1 + a2 * T2``, fitted jointly per group.

Two planes give each group a nine-level grid ``{a1 * t1 + a2 * t2}`` at about
four bits a weight. The fit alternates (the idea of PTQTP, Xiao et al. 2025,
arXiv:2509.16989): start from the exact TWN fit of the weight and of its
residual, then repeat: solve the two scales of each group by least squares
given the codes, and re-round each plane's codes given the other plane.
The squared error never increases from one step to the next.
"""

from __future__ import annotations

import torch

from trit.quant.common import Ternary, grouped
from trit.quant.twn import quantize_twn

ITERATIONS = 6


def _solve_scales(w: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares ``(a1, a2)`` per group for fixed codes: ``(n, G, g)`` -> two ``(n, G, 1)``."""
    p11, p22, p12 = (t1 * t1).sum(-1), (t2 * t2).sum(-1), (t1 * t2).sum(-1)
    q1, q2 = (t1 * w).sum(-1), (t2 * w).sum(-1)
    det = p11 * p22 - p12 * p12
    ok = det.abs() > 1e-12
    a1 = torch.where(ok, (q1 * p22 - q2 * p12) / det.where(ok, torch.ones_like(det)), q1 / p11.clamp(min=1))
    a2 = torch.where(ok, (q2 * p11 - q1 * p12) / det.where(ok, torch.ones_like(det)), torch.zeros_like(q2))
    return a1.unsqueeze(-1), a2.unsqueeze(-1)


def _round(r: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(r / torch.where(a.abs() > 1e-12, a, torch.ones_like(a))), -1, 1) * (a.abs() > 1e-12)


def fit_planes(w: torch.Tensor, iterations: int = ITERATIONS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, G, g)`` float -> codes ``(2, n, G, g)`` in {-1, 0, 1} and scales ``(2, n, G)``."""
    n, groups, g = w.shape
    first = quantize_twn(w.reshape(n, groups * g), g)
    t1 = first.values.float().reshape(w.shape)
    a1 = first.scales.unsqueeze(-1)
    second = quantize_twn((w - a1 * t1).reshape(n, groups * g), g)
    t2 = second.values.float().reshape(w.shape)
    a2 = second.scales.unsqueeze(-1)
    for _ in range(iterations):
        a1, a2 = _solve_scales(w, t1, t2)
        t1 = _round(w - a2 * t2, a1)
        t2 = _round(w - a1 * t1, a2)
    a1, a2 = _solve_scales(w, t1, t2)
    # a plane with a negative scale is the same plane with its codes negated
    t1, a1 = t1 * a1.sign().where(a1 != 0, torch.ones_like(a1)), a1.abs()
    t2, a2 = t2 * a2.sign().where(a2 != 0, torch.ones_like(a2)), a2.abs()
    return torch.stack([t1, t2]).to(torch.int8), torch.stack([a1.squeeze(-1), a2.squeeze(-1)])


def quantize_planes(weight: torch.Tensor, group_size: int) -> list[Ternary]:
    """``(N, K)`` float -> two :class:`Ternary` planes whose sum approximates the weight."""
    codes, scales = fit_planes(grouped(weight, group_size))
    return [Ternary(codes[p].reshape(weight.shape), scales[p]) for p in range(2)]
