"""The GEMV and the dequantizer on the mma layout (``trit/kernels/cuda/gemv.py``, ``gemv.cu``).

On the CPU: the activations' rounding, and the kernel's arithmetic (:func:`gemv.emulate`,
integer sums of codes per scale group, offsets and scales apart) against the reference;
where NVRTC is installed, that every variant compiles for sm_80 and sm_90. On a GPU: the
kernel against the emulation and the reference, and the dequantizer against the layout.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import activations, check_against_gemv_emulation, have_nvrtc, random_layer, rel  # noqa: I001

from trit import format as fmt
from trit.kernels.cuda import gemv, mma, nvrtc
from trit.kernels.reference import linear as ref_linear

SHAPES = [(34, 128, 64), (64, 576, 64), (33, 192, fmt.PER_ROW), (130, 256, 32), (50, 640, 128), (17, 1000, -1),
          (200, 2048, 64)]


def test_activations_round_to_15_bits_a_step_with_the_largest_exact() -> None:
    x = activations(3, 300)
    xi, inv = gemv.quantize_activations(x, 3)
    assert xi.shape == (3, 384) and inv.shape == (3, 3)
    assert xi.abs().max() < 2**15 and torch.equal(xi, xi.round())
    assert not xi[:, 300:].any()  # zero past K
    mant, _ = torch.frexp(inv[inv > 0])
    assert torch.all(mant == 0.5)  # powers of two
    back = (xi.view(3, 3, 128) * inv[..., None]).view(3, -1)[:, :300]
    steps = torch.nn.functional.pad(x.double(), (0, 84)).view(3, 3, 128).abs().amax(-1)
    err = (back - x.double()).abs().view(3, -1)
    assert torch.all(err <= inv.repeat_interleave(128, 1)[:, :300] / 2)  # at most half a unit
    big = x.double().abs() >= steps.repeat_interleave(128, 1)[:, :300] / 128
    assert torch.equal(back[big], x.double()[big])  # a bf16 within 2**-7 of its step's largest: exact
    assert not gemv.quantize_activations(torch.zeros(1, 128, dtype=torch.bfloat16), 1)[1].any()


@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
@pytest.mark.parametrize("m", [1, 3])
def test_the_arithmetic_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    packed, scale = random_layer(n, k, g)
    r = mma.repack(packed, scale, g, k)
    x = activations(m, k)
    want = ref_linear(x.float(), packed, scale.to(torch.bfloat16).float(), g)
    got = gemv.emulate(x, r)
    assert got.shape == (m, n)
    assert rel(got, want) < 2e-4  # bf16 rounding of the output alone is 2**-9


def test_configs() -> None:
    assert [gemv.token_slots(m) for m in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="M <= 4"):
        gemv.token_slots(5)
    assert [gemv.units(g) for g in (32, 64, 128, fmt.PER_ROW)] == [4, 2, 1, 1]
    assert gemv.smem_bytes(2, 10, 64) == 10 * 2 * (256 + 8 + 8)
    assert gemv.smem_bytes(1, 10, 32) == 10 * 288  # 256 + 8 + 16, padded to 16 bytes
    assert gemv.kernel_name(1, gemv.GemvConfig(2, 4, 4, 4), fmt.PER_ROW) == "trit_gemv<1, 2, 0, 4, 4>"
    assert gemv.split_steps(32, 5) == (7, 5) and gemv.split_steps(3, 8) == (1, 3) and gemv.split_steps(9, 1) == (9, 1)
    cfg = gemv.heuristic(1, 1792, 32, 132)  # Llama-3-8B gate_up
    blocks = -(-1792 // (4 * cfg.rt))
    assert cfg.rt == 2 and blocks * cfg.splits >= 4 * 132 // 2 and cfg.splits <= 16


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC is not installed here (CUDA builds of torch bring it)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles(arch: str) -> None:
    for mg in (1, 2, 4):
        for g in (32, 64, 128, fmt.PER_ROW):
            cubin, lowered, log = nvrtc.compile_cubin(gemv.source(), gemv.kernel_name(mg, gemv.GemvConfig(), g), arch)
            assert len(cubin) > 1000 and lowered.startswith("_Z9trit_gemv"), log
    cubin, lowered, log = nvrtc.compile_cubin(gemv.source(), "trit_dequant", arch)
    assert lowered == "_Z12trit_dequantPK2U4PKjPtiiiii", log


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_kernel_matches_its_emulation_and_the_reference(m: int, n: int, k: int, g: int) -> None:
    configs = (gemv.GemvConfig(1, 1, 4, 2), gemv.GemvConfig(2, 3, 4, 4), gemv.GemvConfig(1, 2, 8, 8))
    check_against_gemv_emulation(gemv.linear, configs, m, n, k, g)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_dequantizer_writes_the_layouts_weight(n: int, k: int, g: int) -> None:
    packed, scale = random_layer(n, k, g, "cuda")
    r = mma.repack(packed, scale, g, k)
    assert torch.equal(gemv.dequantize(r).float(), mma.unpack_layout(r))
