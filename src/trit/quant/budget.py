"""A bits budget across layers: which layers get a second trit-plane.

One plane stores about 2.25 bits a weight (groups of 64, fp16 scales), two
planes 4.5. ``trit quantize --bits B`` spends the bits between on the layers
where a second plane cuts the model's loss most per added bit. The
calibration pass measures it: each group of layers that share an input
(q/k/v, o, gate/up, down: the groups vLLM fuses, so a fused layer has one
plane count) is rounded with one plane and with two on the same Hessian, and
the gain is the drop in squared output error, ``tr(E H E^T)`` on the
calibration tokens as GPTQ measures it, each layer's weighted by its output
sensitivity ``F`` (the mean squared gradient of the windows' log-likelihood at
that output, :func:`trit.calibrate.output_fisher`), summed over the group:
``F * |E X|^2 / 2`` is about what the error costs in log-likelihood, so layers
of different kinds and depths compare. Groups are taken by gain per added bit,
largest first, while the budget holds (a greedy knapsack; a group too large
for what is left is skipped for smaller ones).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlaneGain:
    """One group of layers, as the calibration pass measured it."""

    modules: tuple[str, ...]
    weights: int  # float weights, N * K summed
    codes: int  # stored codes of one plane, N * K_pad summed (2 bits each)
    scales: int  # scales of one plane, N * G summed
    error_one: float  # squared output error, one plane, each layer's times its sensitivity, summed
    error_two: float  # the same with two planes
    energy: float  # tr(W H W^T) summed: the layers' output energy (for reports; the choice does not use it)

    def plane_bits(self, scale_bits: int) -> int:
        """What a second plane adds to the stored size, in bits."""
        return 2 * self.codes + scale_bits * self.scales

    def gain(self) -> float:
        """The drop in squared output error a second plane buys."""
        return self.error_one - self.error_two


def choose(gains: list[PlaneGain], bits: float, scale_bits: int) -> set[str]:
    """The modules that get a second plane so that the ternary layers store at most ``bits`` a weight."""
    weights = sum(g.weights for g in gains)
    left = bits * weights - sum(g.plane_bits(scale_bits) for g in gains)
    chosen: set[str] = set()
    for g in sorted(gains, key=lambda g: g.gain() / g.plane_bits(scale_bits), reverse=True):
        if g.gain() > 0 and g.plane_bits(scale_bits) <= left:
            chosen.update(g.modules)
            left -= g.plane_bits(scale_bits)
    return chosen
