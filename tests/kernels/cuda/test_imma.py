"""The int8 tensor-core GEMV on the mma layout (``trit/kernels/cuda/imma.py``, ``imma.cu``).

On the CPU: the kernel's fragments and records, replayed in plain PyTorch, give the exact integer sums the
GEMV's arithmetic is made of (the permutation of each word's inputs in the MMA is the same in A and B); where
NVRTC is installed, that every variant compiles for sm_80 and sm_90. On a GPU: the kernel
against the GEMV's emulation and the reference.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import activations, check_against_gemv_emulation, have_nvrtc, random_layer  # noqa: I001

from trit import format as fmt
from trit.kernels.cuda import gemv, imma, mma, nvrtc

SHAPES = [(34, 128, 64), (64, 576, 64), (33, 192, fmt.PER_ROW), (130, 256, 32), (50, 640, 128), (17, 1000, -1),
          (200, 2048, 64)]


@pytest.mark.parametrize(("n", "k", "g"), SHAPES[:5])
@pytest.mark.parametrize("m", [1, 3, 9, 17])
def test_the_fragments_give_the_exact_sums_of_a_word(m: int, n: int, k: int, g: int) -> None:
    packed, scale = random_layer(n, k, g)
    r = mma.repack(packed, scale, g, k)
    x = activations(m, k)
    got = imma.emulate_fragments(x, r)
    xi, _ = gemv.quantize_activations(x, r.k_steps)
    codes = mma.layout_codes(r)[:n].long()
    want = torch.einsum("mwd,nwd->mnw", xi.long().view(m, -1, 32), codes.view(n, -1, 32))
    assert got.shape == want.shape and torch.equal(got, want)


def test_each_input_has_one_byte_of_the_record() -> None:
    for tt in imma.TOKEN_TILES:
        off = imma.record_offsets(tt)
        hi = off.reshape(-1)
        both = torch.cat([hi, hi + 8])
        assert both.unique().numel() == both.numel() == 2 * 4 * 8 * tt * 32  # no byte written twice
        assert int(both.max()) < 256 * 8 * tt <= imma.record_bytes(tt, 64)


def test_configs() -> None:
    assert [imma.token_tiles(m) for m in (1, 8, 9, 16, 17, 32)] == [1, 1, 2, 2, 4, 4]
    with pytest.raises(ValueError, match="M <= 32"):
        imma.token_tiles(33)
    assert imma.record_bytes(1, 64) == 2048 + 32 + 64
    assert imma.record_bytes(2, fmt.PER_ROW) == 4096 + 64 + 64
    cfg = imma.ImmaConfig(2, 1, 4, 8)
    assert imma.smem_bytes(1, cfg, 3, 64) == 3 * 2144 + 8 * 2 * 128 * (16 + 8)
    assert imma.smem_bytes(1, cfg, 3, fmt.PER_ROW) == 3 * 2112 + 8 * 2 * 128 * 16
    assert imma.kernel_name(2, cfg, fmt.PER_ROW) == "trit_imma<2, 2, 0, 4, 8>"
    r = mma.shape_only(28672, 4096, 64)
    space = imma.configs_for(r, 132)
    big = imma.ImmaConfig(2, 1, 8, 8)
    small = imma.fit_shared_memory(4, big, 32, 99 * 1024 - 1024)  # a 99 KiB GPU (sm_86/89)
    assert small.stages < 8 and imma.smem_bytes(4, small, 1, 32) <= 98 * 1024
    assert imma.fit_shared_memory(1, big, 64, 226 * 1024) == big  # an H200 holds it as it is
    h = imma.heuristic(1, r.row_tiles, r.k_steps, 132)
    assert -(-r.row_tiles // (h.warps * h.rt)) * h.splits >= 2 * 132  # every SM has blocks to run
    assert all(c.splits <= r.k_steps for c in space) and len(set(space)) == len(space)


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC is not installed here (CUDA builds of torch bring it)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles(arch: str) -> None:
    for tt in imma.TOKEN_TILES:
        for g in (32, 64, 128, fmt.PER_ROW):
            for cfg in (imma.ImmaConfig(2, 1, 4, 8), imma.ImmaConfig(1, 1, 8, 4)):
                cubin, lowered, log = nvrtc.compile_cubin(imma.source(), imma.kernel_name(tt, cfg, g), arch)
                assert len(cubin) > 1000 and lowered.startswith("_Z9trit_imma"), log


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16, 23, 32])
@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_kernel_matches_the_gemvs_emulation_and_the_reference(m: int, n: int, k: int, g: int) -> None:
    configs = (imma.ImmaConfig(1, 1, 4, 4), imma.ImmaConfig(2, 3, 4, 8), imma.ImmaConfig(1, 2, 8, 8))
    check_against_gemv_emulation(imma.linear, configs, m, n, k, g)
