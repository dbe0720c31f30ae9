"""The bits budget's choice: a second plane where it cuts the output error most per added bit."""

from __future__ import annotations

from trit.quant.budget import PlaneGain, choose


def gain(name: str, weights: int, error_one: float, error_two: float) -> PlaneGain:
    # groups of 64 with fp16 scales: one plane is 2.25 bits a weight
    return PlaneGain((f"{name}.a", f"{name}.b"), weights, weights, weights // 64, error_one, error_two, energy=1.0)


def test_the_largest_gain_per_bit_first_within_the_budget() -> None:
    gains = [gain("small", 64 * 100, 0.5, 0.1), gain("large", 64 * 1000, 0.9, 0.1), gain("flat", 64 * 100, 0.2, 0.2)]
    weights = sum(g.weights for g in gains)
    assert choose(gains, 2.25 + 1e-9, 16) == set()  # nothing left over one plane
    small_only = 2.25 + 2.25 * 100 / 1200  # one plane everywhere, a second for the small group
    assert choose(gains, small_only, 16) == {"small.a", "small.b"}  # 0.4 over 100 beats 0.8 over 1000
    # what the large group does not fit in, the smaller one still takes; a group that gains nothing never
    assert choose(gains, 4.5, 16) == {"small.a", "small.b", "large.a", "large.b"}
    # the gain is absolute: a layer's output energy does not scale it
    loud = PlaneGain(("loud.a",), 6400, 6400, 100, 0.5, 0.1, energy=1e6)
    assert choose([loud, gains[1]], 2.25 + 2.25 * 6400 / (6400 + 64000), 16) == {"loud.a"}
    assert choose(gains, 2.25 + 2.25 * 1000 / 1200, 16) == {"small.a", "small.b"}
    for bits in (2.3, 2.6, 3.0, 4.0):
        chosen = choose(gains, bits, 16)
        stored = sum(g.plane_bits(16) * (2 if g.modules[0] in chosen else 1) for g in gains)
        assert stored <= bits * weights
