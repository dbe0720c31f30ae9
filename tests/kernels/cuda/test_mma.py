"""The mma layout and kernel (``trit/kernels/cuda/mma.py``, ``mma.cu``).

On the CPU: the load-time layout against format v1 (exact round trip, and the
fragment map of the docstring checked bit by bit, independently of the
repack's own index tables); the decode's bf16 constants; and, where NVRTC is
installed, that every kernel variant compiles for sm_80 and sm_90. On a GPU:
the kernel against the reference on odd shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cuda_helpers import check_layout_kernel, have_nvrtc, random_layer  # noqa: I001

from trit import format as fmt
from trit.kernels.cuda import mma, nvrtc

SHAPES = [(34, 128, 64), (64, 576, 64), (33, 192, fmt.PER_ROW), (130, 256, 32), (50, 640, 128), (17, 1000, -1)]


@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_layout_holds_the_weight_exactly(n: int, k: int, g: int) -> None:
    packed, scale = random_layer(n, k, g)
    r = mma.repack(packed, scale, g, k)
    assert r.wq.dtype == torch.int32 and r.wq.shape == (-(-n // 16), -(-fmt.padded_k(k, g) // 128), 32, 4)
    want = fmt.dequantize(packed, scale.to(torch.bfloat16).float(), k)
    assert torch.equal(mma.unpack_layout(r), want)


def test_the_bits_sit_where_the_docstring_says() -> None:
    n, k, g = 40, 384, 64
    packed, scale = random_layer(n, k, g)
    codes = fmt.unpack_codes(packed).long()
    r = mma.repack(packed, scale, g, k)
    words = r.wq.long() & 0xFFFFFFFF
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        tile, step, lane, j, q = (int(torch.randint(hi, (1,), generator=gen)) for hi in (3, 3, 32, 4, 8))
        g_, t = lane // 4, lane % 4
        s, reg = q // 4, q % 4
        row = 16 * tile + g_ + (8 if reg in (1, 3) else 0)
        col = 128 * step + 32 * j + 16 * s + 2 * t + (8 if reg >= 2 else 0)
        w = int(words[tile, step, lane, j])
        for element, shift in ((0, 2 * q), (1, 16 + 2 * q)):
            got = (w >> shift) & 3
            want = int(codes[row, col + element]) if row < n else 1  # rows past N: zero weights (code 1)
            assert got == want, (tile, step, lane, j, q, element)
    sw = r.sc.long() & 0xFFFFFFFF
    s16 = scale.to(torch.bfloat16).view(torch.int16).long() & 0xFFFF
    for tile in range(3):
        for grp in range(scale.shape[1]):
            for g_ in range(8):
                lo, hi = int(sw[tile, grp, g_]) & 0xFFFF, int(sw[tile, grp, g_]) >> 16
                assert lo == int(s16[16 * tile + g_, grp])
                assert hi == (int(s16[16 * tile + g_ + 8, grp]) if 16 * tile + g_ + 8 < n else 0)


def _bf16(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float())


@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_a_shape_only_layout_has_the_repacked_ones_tiles(n: int, k: int, g: int) -> None:
    r = mma.repack(*random_layer(n, k, g), g, k)
    s = mma.shape_only(n, k, g)
    assert (s.row_tiles, s.k_steps, s.scale_groups, s.n, s.k) == (r.row_tiles, r.k_steps, r.scale_groups, r.n, r.k)


def test_the_decode_constants_are_exact() -> None:
    """``0x4300 | c`` is the bf16 128 + c, and minus 129 it is c - 1: the constants ``mma.cu`` uses."""
    assert (_bf16(0x3F80), _bf16(0xC301), _bf16(0x4300)) == (1, -129, 128)
    for c in range(3):
        assert _bf16(0x4300 | c) == 128 + c
        assert torch.tensor(_bf16(0x4300 | c), dtype=torch.bfloat16) - 129.0 == c - 1


def _decode_registers() -> list[tuple[int, int, int, int]]:
    """``decode``'s four registers as ``mma.cu`` writes them: (shift of v, shift of the mask, FMA multiplier,
    FMA addend), the constants read from the source (``common.cuh``'s names resolved)."""
    import re

    names = dict(re.findall(r"#define (\w+) (0x[0-9A-Fa-f]+)u", mma.SOURCE_FILE.with_name("common.cuh").read_text()))
    body = mma.SOURCE_FILE.read_text().split("void decode(", 1)[1].split("\n}", 1)[0]
    regs = re.findall(r"and_or\(v(?: >> (\d+))?, mask(?: << (\d+))?, BASE\), (\w+), (\w+)\)", body)
    assert len(regs) == 4, body
    return [(int(a or 0), int(b or 0), int(names.get(m, m).rstrip("u"), 16), int(names.get(c, c).rstrip("u"), 16))
            for a, b, m, c in regs]


def test_the_decode_gives_each_code_minus_one() -> None:
    """Every register of a word, as ``decode`` computes it (``v = w >> 8s``; ``(v >> a) & (mask << b) | BASE``, a
    bf16 pair 128 + 4^(b/2) c; one bf16x2 FMA with the source's constants), is code - 1 exactly, for each code at
    each position of the word (the layout's register q at bits 2q and 16 + 2q), whatever the other codes are."""
    regs = _decode_registers()
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(0, 3, (4096, 16), generator=gen)  # 16 codes a word, 0..2 each
    packed = (words << (2 * torch.arange(16))).sum(1)  # code j at bits 2j (j < 8: element 0 of register j)
    for s in (0, 1):
        v = packed >> (8 * s)
        for i, (shift, mshift, mul, add) in enumerate(regs):
            q = 4 * s + i
            t = ((v >> shift) & (0x00030003 << mshift)) | 0x43004300
            for half in (0, 1):
                bits = (t >> (16 * half)) & 0xFFFF
                value = (bits.to(torch.int32) << 16).view(torch.float32)  # the bf16 pair's half, exactly
                got = value * _bf16(mul & 0xFFFF) + _bf16(add & 0xFFFF)  # exact in float32 (small integers)
                assert torch.equal(got, (words[:, q + 8 * half] - 1).float()), (s, i, half)
    assert {mul & 0xFFFF for _, _, mul, _ in regs} <= {0x3F80, 0x3E80, 0x3D80}  # 1, 1/4, 1/16: exact products


def test_configs_and_shared_memory() -> None:
    assert [mma.token_tiles(m) for m in (1, 8, 9, 16, 17, 64, 65, 4096)] == [1, 1, 2, 2, 4, 8, 8, 8]
    assert [mma.token_slices(m, 8) for m in (1, 64, 65, 300)] == [1, 1, 2, 5]
    assert mma.token_tiles(300, 4) == 4 and mma.token_slices(300, 4) == 10
    with pytest.raises(ValueError, match="token tiles"):
        mma.token_tiles(10, 16)
    # above 64 rows: no fp32 fold, 64 tokens a block; the search space keeps to those without the fold too
    big = mma.heuristic(256, 1792, 32, 132)
    assert (big.mt, big.fold, big.rt) == (8, False, 1)
    assert not any(mma.heuristic(m, 1792, 32, 132).fold for m in (9, 16, 33, 64))  # its fp32 sums would spill
    r = mma.MmaWeights(torch.zeros(1792, 32, 32, 4, dtype=torch.int32), torch.zeros(1792, 64, 8, dtype=torch.int32),
                       28672, 4096, 64)
    space = mma.configs_for(256, r, 132)
    assert space and {c.mt for c in space} == {4, 8} and not any(c.fold for c in space)
    assert all(mma.smem_bytes(c.mt, c, 64) <= 200 * 1024 for c in space)
    cfg = mma.MmaConfig(rt=2, ki=2, splits=1, stages=3, fold=True, warps=4)
    # 3 stages x (16 token rows x 264 bf16 + 4 warps x 2 tiles x 2 steps x 512 B + 4 x 2 x 4 groups x 32 B)
    assert mma.smem_bytes(2, cfg, 64) == 3 * (16 * 264 * 2 + 8192 + 1024)
    assert mma.kernel_name(2, cfg, fmt.PER_ROW) == "trit_mma<2, 2, 2, 0, 3, true, 4>"
    with pytest.raises(ValueError, match="groups"):
        mma.repack(*random_layer(16, 96, 48), 48)


def test_a_config_too_big_for_the_gpu_is_cut_down_to_fit() -> None:
    """The shipped table was tuned on an H200 (227 KiB a block); a GPU with 99 KiB runs each config cut down."""
    import json

    big = mma.MmaConfig(rt=4, ki=2, splits=2, stages=3, fold=False, warps=8, mt=8)
    assert mma.smem_bytes(8, big, 32) > 200 * 1024
    for limit in (163 * 1024, 99 * 1024, 47 * 1024):
        cut = mma.fit_shared_memory(8, big, 32, limit)
        assert mma.smem_bytes(8, cut, 32) <= limit and cut.splits == big.splits and cut.mt == big.mt
    assert mma.fit_shared_memory(8, big, 32, 228 * 1024) == big  # fits: unchanged
    assert mma.fit_shared_memory(8, big, 32, 99 * 1024) == mma.MmaConfig(4, 1, 2, 2, False, 8, 8)  # stages, then ki
    table = json.loads((Path(mma.__file__).parents[1] / "tuned" / "h200.json").read_text())["configs"]["cuda_mma"]
    for key, entry in table.items():
        m, g = int(key.split(",")[0]), int(key.split(",")[3])
        cfg = mma.MmaConfig(**entry)
        mt = mma.token_tiles(m, cfg.mt)
        assert mma.smem_bytes(mt, mma.fit_shared_memory(mt, cfg, g, 99 * 1024 - 1024), g) <= 98 * 1024, key


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC is not installed here (CUDA builds of torch bring it)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_variant_compiles(arch: str) -> None:
    for mt in (1, 2, 4, 8):
        for g in (32, 64, 128, fmt.PER_ROW):
            cfg = mma.MmaConfig(rt=2, ki=1 if mt == 8 else 2, stages=3, fold=mt <= 4, warps=8 if mt == 8 else 4)
            cubin, lowered, log = nvrtc.compile_cubin(mma.source(), mma.kernel_name(mt, cfg, g), arch)
            assert len(cubin) > 1000 and lowered.startswith("_Z8trit_mma"), log


# configs a test runs: up to 64 rows, split-K on and off, the fold on and off; above, slices of 32 or 64 tokens
# (the grid's third dimension) and the heuristic's own config
CONFIGS = (mma.MmaConfig(1, 1, 1, 3, False), mma.MmaConfig(2, 2, 3, 4, True), mma.MmaConfig(1, 1, 2, 3, False, 8))
SLICED = (None, mma.MmaConfig(1, 1, 1, 3, False, 4, 8), mma.MmaConfig(4, 2, 2, 2, False, 8, 8),
          mma.MmaConfig(1, 2, 3, 3, False, 4, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 3, 17, 64, 65, 128, 200, 300])
@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_kernel_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    check_layout_kernel(mma.linear, CONFIGS if m <= mma.MAX_M else SLICED, m, n, k, g)


def test_a_larger_workspace_keeps_the_smaller_one_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA graph captured with the smaller workspace may replay later: growing must not free it."""
    monkeypatch.setattr(mma, "_WORKSPACE", {})
    dev = torch.device("cpu", 0)
    small = mma.workspace(dev, 100, 10)
    assert mma.workspace(dev, 50, 10)[0] is small[0]  # big enough: the same buffer
    big = mma.workspace(dev, 1000, 2000)
    assert big[0].numel() == 1000 and big[1].numel() == 2000 and not big[0].any()
    assert [w[0].numel() for w in mma._WORKSPACE[0]] == [100, 1000]  # the first still referenced
