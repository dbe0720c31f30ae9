"""The int8 wgmma kernel (``trit/kernels/cuda/wgmma_a8.py``, ``wgmma_a8.cu``).

On the CPU: the fragment order and the arithmetic, replayed by :func:`wgmma_a8.emulate`, equal the W1.58A8
reference; the configs it may run are ones the kernel's asserts take; where NVRTC is installed, every token width
compiles for sm_90a. On an sm_90 GPU: the kernel and its rounding launch against the reference.
"""

from __future__ import annotations

import json

import pytest
import torch
from cuda_helpers import activations, have_nvrtc, random_layer  # noqa: I001

from trit import format as fmt
from trit.kernels import reference, tuning
from trit.kernels.cuda import mma, nvrtc, wgmma, wgmma_a8
from trit.kernels.cuda.wgmma import WgmmaConfig

SHAPES = [(64, 576), (33, 192), (300, 1000), (130, 256), (48, 4096)]


def test_the_input_order_is_a_permutation_within_each_word() -> None:
    order = wgmma_a8.input_order()
    assert sorted(order.tolist()) == list(range(32))
    # lane t's first register holds inputs 2t, 2t + 1 of the first k16 step and the same of the second
    assert order[:4].tolist() == [0, 16, 1, 17] and order[4:8].tolist() == [2, 18, 3, 19]


GROUPS = (fmt.PER_ROW, 64, 128)


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 17])
def test_the_replayed_kernel_equals_the_w158a8_reference(m: int, n: int, k: int, g: int) -> None:
    torch.manual_seed(n + k + m)
    packed, scale = random_layer(n, k, g)
    r = mma.repack(packed, scale, g, k)
    x = activations(m, k)
    want = reference.linear_a8(x.float(), packed, scale.float().to(torch.bfloat16).float(), g)
    got = wgmma_a8.emulate(x, r)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())), \
        float((got - want).abs().max())


def test_the_s8_decode_gives_each_byte_its_code_less_one() -> None:
    codes = torch.randint(0, 3, (1000, 4, 4))  # (word, register, byte): never 3
    shift = 2 * torch.arange(4)[:, None] + 8 * torch.arange(4)[None, :]
    words = (codes << shift).sum((1, 2))  # register q's codes in bits 2q + 8b
    for q in range(4):
        regs = wgmma_a8.decode_s8(words >> (2 * q))
        got = torch.stack([(regs >> (8 * b)) & 0xFF for b in range(4)], 1)
        assert torch.equal(got, (codes[:, q] - 1) & 0xFF), q


def test_the_rounding_reference_is_bitnets_in_the_fragment_order() -> None:
    x = activations(5, 200)
    q, s, sums = wgmma_a8.quantize_reference(x, 256)
    want_q, want_s = reference.quantize_activations_int8(x)
    assert torch.equal(s, want_s.view(-1))
    unpermuted = torch.empty_like(q)
    unpermuted.view(5, -1, 32)[:, :, wgmma_a8.input_order()] = q.view(5, -1, 32)
    assert torch.equal(unpermuted[:, :200], want_q) and not unpermuted[:, 200:].any()
    assert torch.equal(sums, want_q.sum(dim=1, dtype=torch.int32))


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize(("n", "k"), [(28672, 4096), (4096, 14336), (6144, 4096), (6912, 2560), (64, 576)])
@pytest.mark.parametrize("m", [16, 17, 64, 200, 256, 2048])
def test_every_config_it_may_run_is_valid_and_fits(n: int, k: int, m: int, g: int) -> None:
    r = mma.shape_only(n, k, g)
    cands = wgmma_a8.configs_for(m, r, 132)
    assert cands
    for cfg in [*cands, wgmma_a8.heuristic(m, r, 132), wgmma_a8.heuristic(m, r, 78)]:
        assert wgmma_a8.valid(cfg, g), cfg
        assert wgmma_a8.smem_bytes(cfg, g) <= wgmma.SMEM_LIMIT, cfg


def test_the_heuristic_picks_the_tile_tuning_picked_on_the_h100() -> None:
    """Untuned shapes run the heuristic; it is written after the H100's tuning, so it should mostly agree with the
    shipped table (the ones it misses were within a few percent when tuned)."""
    table = json.loads((tuning.SHIPPED / "h100.json").read_text())["configs"]["cuda_wgmma_a8"]
    fields = ("ntok", "rt", "ki", "splits", "warps")
    agree = {True: 0, False: 0}
    for key, tuned in table.items():
        m, n, k, g, _ = key.split(",")
        cfg = wgmma_a8.heuristic(int(m), mma.shape_only(int(n), int(k), int(g)), 132)
        agree[all(getattr(cfg, f) == tuned[f] for f in fields)] += 1
    assert agree[True] >= 3 * agree[False] and agree[True] >= 40, agree


def test_it_refuses_what_it_cannot_run() -> None:
    assert not wgmma_a8.valid(WgmmaConfig(ws=1))  # no warp-specialized variant
    assert not wgmma_a8.valid(WgmmaConfig(ntok=16, warps=8))  # a copy pass of 32 tokens
    assert not wgmma_a8.valid(WgmmaConfig(ki=1, bufs=3))
    assert wgmma_a8.valid(WgmmaConfig(128, 2, 1, 1, 3, 8, bufs=4)) and not wgmma_a8.valid(
        WgmmaConfig(128, 2, 1, 1, 3, 8, bufs=4), 64)  # groups: float sums beside the int32 ones
    assert "one scale a row or groups of 64 or 128" in wgmma_a8.supported(torch.device("cpu"), 32)
    for g in GROUPS:
        assert "CUDA, not cpu" in wgmma_a8.supported(torch.device("cpu"), g)
    r = mma.repack(*random_layer(64, 576, 32), 32, 576)
    with pytest.raises(ValueError, match="groups of 32"):
        wgmma_a8.linear(torch.zeros(4, 576), r)


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC is not installed here (CUDA builds of torch bring it)")
def test_every_width_compiles_for_sm_90a() -> None:
    cfgs = [WgmmaConfig(ntok, 2 if ntok <= 128 else 1, 1, 1, 3, 8, bufs=4) for ntok in wgmma.TOKENS if ntok >= 32]
    cfgs += [WgmmaConfig(16, 1, 1, 1, 4, 4, bufs=2), WgmmaConfig(128, 1, 2, 1, 3, 8, bufs=4)]
    pairs = [(cfg, g) for cfg in cfgs for g in GROUPS if wgmma_a8.valid(cfg, g)]
    assert {g for _, g in pairs} == set(GROUPS) and all(wgmma_a8.valid(cfg) for cfg in cfgs)
    names = [wgmma_a8.kernel_name(cfg, g) for cfg, g in pairs]
    names += [wgmma_a8.kernel_name(WgmmaConfig(64, 1, 2, 1, 6, 8, bufs=4), 64)]  # 4 buffers, 2 steps a group
    for name in names:
        cubin, lowered, log = nvrtc.compile_cubin(wgmma_a8.source(), name, "sm_90a")
        assert len(cubin) > 1000 and lowered.startswith("_Z13trit_wgmma_a8"), (name, log)
        assert "C7513" not in log, (name, log)  # ptxas would serialize the wgmmas


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == wgmma.ARCH


CONFIGS = (None, WgmmaConfig(16, 1, 1, 1, 4, 4), WgmmaConfig(64, 2, 1, 2, 4, 8, bufs=4),
           WgmmaConfig(128, 1, 2, 3, 3, 8, bufs=4), WgmmaConfig(256, 1, 1, 1, 3, 8, bufs=2),
           WgmmaConfig(32, 2, 1, 4, 5, 8, bufs=4))


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", [1, 3, 17, 100, 300, 2048])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_the_kernel_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    torch.manual_seed(m + n + k)
    packed, scale = random_layer(n, k, g, "cuda")
    r = mma.repack(packed, scale, g, k)
    x = activations(m, k, "cuda")
    q, s, sums = wgmma_a8.quantize(x, r.k_steps * mma.K_STEP)
    rq, rs, rsums = wgmma_a8.quantize_reference(x, r.k_steps * mma.K_STEP)
    assert (q.int() - rq.int()).abs().max() <= 1 and int((q != rq).sum()) <= max(2, q.numel() // 500)  # ties
    assert torch.equal(sums, q.sum(dim=1, dtype=torch.int32))
    want = reference.linear_a8(x.float(), packed, scale.float().to(torch.bfloat16).float(), g)
    for cfg in (c for c in CONFIGS if c is None or wgmma_a8.valid(c, g)):
        for _ in range(2):  # split-K leaves its workspace zero
            y = wgmma_a8.linear(x, r, cfg).float()
            err = float((y - want).norm() / want.norm())
            assert err < 4e-3, (cfg, err)  # the bf16 rounding of the output alone


def test_the_shipped_configs_are_valid_and_fit() -> None:
    tables = {path.name: json.loads(path.read_text())["configs"].get("cuda_wgmma_a8", {})
              for path in sorted(tuning.SHIPPED.glob("*.json"))}
    assert tables.get("h100.json")  # tuned on the H100 (benchmarks/wgmma_a8_tune.py)
    for name, table in tables.items():
        for key, entry in table.items():
            cfg, g = WgmmaConfig(**entry), int(key.split(",")[3])
            assert wgmma_a8.group_refusal(g) is None, (name, key)
            assert wgmma_a8.valid(cfg, g) and wgmma_a8.smem_bytes(cfg, g) <= wgmma.SMEM_LIMIT, (name, key)
