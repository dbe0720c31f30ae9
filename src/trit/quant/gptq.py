"""GPTQ for ternary weights: Hessian-aware rounding with error feedback, one or two trit-planes.

The layer's output error on calibration inputs ``X`` is ``||(W - Q) X^T||^2 =
tr((W - Q) H (W - Q)^T)`` with ``H = X^T X``. GPTQ (Frantar et al. 2022,
arXiv:2210.17323) quantizes one input column at a time and spreads its
rounding error over the columns not yet quantized, weighted by the inverse
Hessian (through its Cholesky factor); columns go in blocks so the updates are
matrix products. Here each column is rounded to its group's ternary grid:

- one plane: ``{-a, 0, +a}``, ``a`` from the exact TWN fit of the group's
  weights as they stand (error feedback included) when the group starts;
- two planes: the nine levels ``a1 * t1 + a2 * t2`` from
  :func:`trit.quant.planes.fit_planes`, fitted the same way;
- ``int_bits`` (the W4A8 recipe's weights, not ternary): the symmetric integer
  levels ``a * {-2^(b-1) .. 2^(b-1) - 1}`` with ``a = max|w| / ((2^b - 1) / 2)``
  (the min-max grid compressed-tensors uses);
- ``int_bits`` with ``zero_point`` (int2 and int3 GPTQ tools' grid, for the
  same-bits comparison): the asymmetric levels ``a * ({0 .. 2^b - 1} - z)``,
  ``a = (max - min) / (2^b - 1)`` over the group's weights and zero,
  ``z = round(-min / a)``; the "scales" are then ``(scale, zero)`` pairs.

``H`` gets ``damp * mean(diag(H))`` on its diagonal. With ``act_order`` the
columns go in order of decreasing ``diag(H)``, and each group's grid is fitted
up front on the original weights (a group's columns are then not contiguous
in the processing order). Pure math: tensors in, codes and scales out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trit import format as fmt
from trit.quant.planes import fit_planes
from trit.quant.twn import quantize_twn


@dataclass(frozen=True)
class GptqOptions:
    """GPTQ's settings; the defaults are the recipe every measured result used (``trit quantize`` shows them)."""

    group_size: int = fmt.DEFAULT_GROUP_SIZE
    planes: int = 1  # 1 or 2 ternary planes
    damp: float = 0.01  # fraction of mean(diag(H)) added to the diagonal
    act_order: bool = True  # columns in order of decreasing Hessian diagonal
    block_size: int = 128
    refit: bool = True  # least-squares scales for the final codes under H
    passes: int = 3  # with refit: GPTQ again on the refitted scales as a fixed grid, this many passes in all
    # calibration: aim at the float model's outputs, not the weight on quantized inputs (two calibration streams);
    # None: for one plane only, where it measured better (set so on construction)
    float_target: bool | None = None
    int_bits: int | None = None  # None: ternary planes; b: symmetric b-bit integer levels (one "plane")
    zero_point: bool = False  # with int_bits: asymmetric levels, a (scale, zero) pair a group

    def __post_init__(self) -> None:
        if self.float_target is None:
            object.__setattr__(self, "float_target", self.planes == 1 and self.int_bits is None)
        if self.int_bits is not None and self.planes != 1:
            raise ValueError("an integer grid is one plane")
        if self.zero_point and (self.int_bits is None or self.refit):
            raise ValueError("a zero point is for an integer grid, without refit (its scales are not least-squares)")

    @property
    def grid_width(self) -> int:
        """Numbers a group's grid holds: a scale a plane, or a scale and a zero point."""
        return 2 if self.zero_point else self.planes


def int_range(bits: int) -> tuple[int, int]:
    """The codes of a symmetric ``bits``-bit integer grid: ``(-2^(b-1), 2^(b-1) - 1)``."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def fit_grid(w: torch.Tensor, planes: int, int_bits: int | None = None, zero_point: bool = False) -> torch.Tensor:
    """``(N, g)`` float -> grid scales ``(N, planes)``: TWN for one plane, the joint fit for two, min-max
    for an integer grid; with ``zero_point``, ``(N, 2)``: each row's scale and zero point."""
    if zero_point:
        lo = w.amin(dim=1).clamp(max=0)
        hi = w.amax(dim=1).clamp(min=0)
        scale = ((hi - lo) / (2**int_bits - 1)).clamp(min=1e-12)
        return torch.stack([scale, torch.round(-lo / scale)], dim=1)
    if int_bits is not None:
        lo, hi = int_range(int_bits)
        return (w.abs().amax(dim=1, keepdim=True) / ((hi - lo) / 2)).clamp(min=1e-12)
    if planes == 1:
        return quantize_twn(w, -1).scales  # (N, 1)
    _, scales = fit_planes(w.unsqueeze(1))  # (2, N, 1)
    return scales[:, :, 0].T.contiguous()  # (N, 2)


_COMBOS = torch.tensor([(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)], dtype=torch.float32)  # (9, 2)


def round_to_grid(
    col: torch.Tensor, scales: torch.Tensor, int_bits: int | None = None, zero_point: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest grid point per row: ``(N,)`` values, ``(N, P)`` scales -> ``(N,)`` values and ``(N, P)`` codes
    (``(N, 1)`` codes ``0 .. 2^b - 1`` with a zero point)."""
    if zero_point:
        a, z = scales[:, 0], scales[:, 1]
        t = torch.clamp(torch.round(col / a) + z, 0, 2**int_bits - 1)
        return a * (t - z), t[:, None]
    if int_bits is not None:
        lo, hi = int_range(int_bits)
        a = scales[:, 0]
        t = torch.clamp(torch.round(col / a.clamp(min=1e-12)), lo, hi)
        return a * t, t[:, None]
    if scales.shape[1] == 1:
        a = scales[:, 0]
        t = torch.clamp(torch.round(col / a.clamp(min=1e-12)), -1, 1) * (a > 0)
        return a * t, t[:, None]
    combos = _COMBOS.to(col.device)
    levels = scales @ combos.T  # (N, 9)
    best = (levels - col[:, None]).abs().argmin(dim=1)
    return levels.gather(1, best[:, None])[:, 0], combos[best]


def hessian_inverse_factor(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``, damping raised until it factors."""
    eye = torch.eye(h.shape[0], device=h.device, dtype=h.dtype)
    mean_diag = h.diagonal().mean().clamp(min=1e-8)
    for attempt in range(6):
        try:
            chol = torch.linalg.cholesky(h + damp * (10**attempt) * mean_diag * eye)
            return torch.linalg.cholesky(torch.cholesky_inverse(chol), upper=True)
        except RuntimeError:  # torch.linalg.LinAlgError: not positive definite at this damping
            continue
    raise ValueError("Hessian is not positive definite even with 1e5 x damping; are the calibration inputs all zero?")


def gptq_ternary(weight: torch.Tensor, h: torch.Tensor, opts: GptqOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ one layer: ``(N, K)`` weight, ``(K, K)`` Hessian -> codes ``(P, N, K)`` int8, scales ``(P, N, G)`` f32.

    K must be a whole number of groups (pad first); G is ``K // group_size`` (1 for -1). With ``passes > 1``
    (and ``refit``) each later pass rounds again onto the scales the pass before refitted, then refits them.
    The column order and the inverse Hessian's factor are the same for every pass: computed once.
    """
    k = weight.shape[1]
    g = fmt.group_width(opts.group_size, k)
    if k % g:
        raise ValueError(f"K = {k} is not a multiple of the group size {opts.group_size}; pad it first")
    h = h.float()
    hd = h.clone()
    dead = hd.diagonal() == 0
    hd[dead, dead] = 1.0
    perm = torch.argsort(hd.diagonal(), descending=True) if opts.act_order else torch.arange(k, device=weight.device)
    hinv = hessian_inverse_factor(hd[perm][:, perm], opts.damp)
    codes, scales = _gptq_pass(weight, h, dead, perm, hinv, opts, None)
    for _ in range(opts.passes - 1 if opts.refit else 0):
        codes, scales = _gptq_pass(weight, h, dead, perm, hinv, opts, scales)
    return codes, scales


def _gptq_pass(weight: torch.Tensor, h: torch.Tensor, dead: torch.Tensor, perm: torch.Tensor, hinv: torch.Tensor,
               opts: GptqOptions, grid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One GPTQ pass in column order ``perm`` with the inverse Hessian's upper factor ``hinv`` (in that order):
    each group's grid fitted as it goes (or up front), or ``grid`` ``(P, N, G)`` as given. ``h`` for the refit."""
    n, k = weight.shape
    g = fmt.group_width(opts.group_size, k)
    w = weight.float().clone()
    w[:, dead] = 0.0
    static = opts.act_order or opts.group_size == fmt.PER_ROW or grid is not None
    if grid is not None:
        scales = grid.permute(1, 2, 0).to(w.device, torch.float32).contiguous()  # (N, G, P)
    else:
        scales = torch.zeros(n, k // g, opts.grid_width, device=w.device)
        if static:  # every group's grid from the original weights, before any column moves
            for j in range(k // g):
                scales[:, j] = fit_grid(w[:, j * g:(j + 1) * g], opts.planes, opts.int_bits, opts.zero_point)
    w = w[:, perm]
    codes = torch.zeros(opts.planes, n, k, device=w.device)
    block = opts.block_size if static else g * max(1, opts.block_size // g)  # blocks hold whole groups
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            if not static and col % g == 0:  # a group starts: fit its grid on the weights as they stand now
                scales[:, col // g] = fit_grid(w1[:, i:i + g], opts.planes, opts.int_bits, opts.zero_point)
            q, t = round_to_grid(w1[:, i], scales[:, col // g], opts.int_bits, opts.zero_point)
            codes[:, :, col] = t.T
            e = (w1[:, i] - q) / hinv1[i, i]
            w1[:, i:] -= e[:, None] * hinv1[i, i:][None, :]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    codes, scales = codes.to(torch.int8), scales.permute(2, 0, 1).contiguous()
    if opts.refit:
        codes, scales = refit_scales(weight.float(), codes, scales, h, flip=opts.int_bits is None)
    return codes, scales


def refit_scales(
    weight: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, h: torch.Tensor, chunk: int = 64,
    flip: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes fixed, the scales of each row that minimise its output error: a ``P*G`` least-squares solve.

    Row ``n``'s weight is ``sum_{p,g} a[p,g] * b[p,g]`` with ``b[p,g]`` plane ``p``'s codes in group ``g``
    (zero elsewhere); the best ``a`` solves ``(B H B^T) a = B H w``. A negative solution flips that group's codes
    (ternary codes are symmetric); with ``flip=False`` (an integer grid, whose codes are not: -8 has no +8) that
    group keeps its scale instead.
    """
    p, n, k = codes.shape
    groups = scales.shape[2]
    h = h.float()
    member = torch.nn.functional.one_hot(torch.arange(k, device=h.device) // (k // groups), groups).float()  # (K, G)
    out = scales.clone()
    eye = torch.eye(p * groups, device=h.device)
    for r0 in range(0, n, chunk):
        t = codes[:, r0:r0 + chunk].float()  # (P, c, K)
        b = (t[:, :, :, None] * member).permute(1, 0, 3, 2).reshape(t.shape[1], p * groups, k)  # (c, PG, K)
        bh = b @ h
        a = bh @ b.transpose(1, 2)
        a = a + 1e-6 * a.diagonal(dim1=1, dim2=2).mean(-1).clamp(min=1e-12)[:, None, None] * eye
        sol = torch.linalg.solve(a, bh @ weight[r0:r0 + chunk, :, None])[..., 0]  # (c, PG)
        out[:, r0:r0 + chunk] = sol.reshape(-1, p, groups).permute(1, 0, 2)
    negative = out < 0
    if not flip:
        return codes, torch.where(negative, scales, out)
    codes = torch.where(negative.repeat_interleave(k // groups, dim=2), -codes, codes)
    return codes, out.abs()


def float_target_weight(weight: torch.Tensor, h: torch.Tensor, cross: torch.Tensor, damp: float) -> torch.Tensor:
    """The weight whose outputs on the quantized inputs best match the float layer's outputs on the float inputs.

    Calibration rows run through the quantized layers before this one (inputs ``X_q``) and through the float
    model (inputs ``X_f``). The quantized weight should reproduce ``W X_f``, not ``W X_q``:
    ``||X_f W^T - X_q Q^T||^2 = tr((W' - Q) H (W' - Q)^T) + const`` with ``W' = W R H^-1``, ``H = X_q^T X_q`` and
    ``R = X_f^T X_q`` (``cross``). So GPTQ on ``W'`` with the same ``H`` aims at the float outputs (the
    asymmetric calibration of GPTAQ, Li et al. 2025). ``H`` is damped as GPTQ damps it.
    """
    h = h.float()
    hd = h + damp * h.diagonal().mean().clamp(min=1e-8) * torch.eye(h.shape[0], device=h.device)
    return torch.linalg.solve(hd, (weight.float() @ cross.float()).T).T  # W R H^-1, H symmetric


def output_error(weight: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    """``tr((W - Q) H (W - Q)^T)``: the squared output error summed over the calibration inputs."""
    d = (weight - q).double()
    return float(torch.einsum("nk,kl,nl->", d, h.double(), d))


def hessian(x: torch.Tensor) -> torch.Tensor:
    """``X^T X`` of inputs ``(..., K)``: ``(K, K)`` float64, so that batches can be summed without loss."""
    x2 = x.reshape(-1, x.shape[-1]).double()
    return x2.T @ x2


def dequantize_planes(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes ``(P, N, K)`` and scales ``(P, N, G)`` -> the float weight ``(N, K)``."""
    return fmt.apply_scales(codes.float(), scales).sum(0)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, opts: GptqOptions) -> torch.Tensor:
    """What :func:`gptq_ternary` returned, as the float weight ``(N, K)``: planes summed, or, with a zero point,
    ``scale * (code - zero)`` (``scales`` ``(2, N, G)``: scales, then zero points)."""
    if not opts.zero_point:
        return dequantize_planes(codes, scales)
    return fmt.apply_scales(codes[0].float() - fmt.apply_scales(torch.ones_like(codes[0], dtype=torch.float32),
                                                                 scales[1]), scales[0])


__all__ = ["GptqOptions", "gptq_ternary", "int_range", "float_target_weight", "output_error", "hessian", "dequantize_planes",
           "round_to_grid"]
