"""GGUF's ternary block codecs against the ``gguf`` package's own quantizers and the formats' written layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trit import ggml


def _codes(n: int, k: int, seed: int = 0, high: int = 3) -> torch.Tensor:
    return torch.randint(0, high, (n, k), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


def _scales(n: int, blocks: int, seed: int = 1) -> torch.Tensor:
    return (torch.rand(n, blocks, generator=torch.Generator().manual_seed(seed)) + 0.1).half()


@pytest.mark.parametrize("f", [ggml.Q2_0, ggml.PQ2_0, ggml.Q2_0_G128, ggml.TQ2_0, ggml.TQ1_0, ggml.PTQ1_0])
def test_round_trip(f: ggml.BlockFormat) -> None:
    n, k = 3, 512
    codes, scales = _codes(n, k, high=4 if f.name.startswith(("Q2", "PQ2")) else 3), _scales(n, k // f.block)
    raw = ggml.encode(f, codes, scales)
    assert raw.shape == (n, f.row_bytes(k))
    got_codes, got_scales = ggml.decode(f, raw, k)
    assert torch.equal(got_codes, codes)
    assert torch.equal(got_scales, scales)


@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0"])
def test_bytes_equal_the_gguf_packages_quantizer(name: str) -> None:
    """The gguf package's quantizer (a port of ggml's) rounds ternary floats to the bytes trit writes."""
    from gguf import GGMLQuantizationType, quants

    f = getattr(ggml, name)
    n, k = 4, 512
    codes, scales = _codes(n, k), _scales(n, k // f.block)
    weights = ((codes.float() - 1) * scales.float().repeat_interleave(f.block, 1)).numpy()
    theirs = quants.quantize(weights, GGMLQuantizationType[name])
    assert np.array_equal(ggml.encode(f, codes, scales).numpy(), theirs)
    back = quants.dequantize(theirs, GGMLQuantizationType[name])
    c, s = ggml.decode(f, torch.from_numpy(theirs), k)
    assert np.array_equal(((c.float() - 1) * s.float().repeat_interleave(f.block, 1)).numpy(), back)


def test_q2_0_block_layout() -> None:
    """Q2_0 (ggml-common.h's block_q2_0): fp16 d first, then weight j in bits 2(j % 4) of byte j / 4."""
    codes = torch.zeros(1, 64, dtype=torch.int8)
    codes[0, 5] = 3  # byte 1, bits 2-3
    codes[0, 63] = 2  # byte 15, bits 6-7
    raw = ggml.encode(ggml.Q2_0, codes, torch.tensor([[0.5]]))
    assert raw.shape == (1, 18)
    assert raw[0, :2].view(torch.float16).item() == 0.5
    assert raw[0, 2 + 1].item() == 3 << 2 and raw[0, 2 + 15].item() == 2 << 6
    assert int(raw[0, 2:].sum()) == (3 << 2) + (2 << 6)


def test_tq2_0_block_layout() -> None:
    """TQ2_0: 64 bytes then d; weight 128c + 32l + m in byte 32c + m, bits 2l."""
    codes = torch.ones(1, 256, dtype=torch.int8)  # value 0 everywhere
    codes[0, 128 + 64 + 7] = 2  # c=1, l=2, m=7
    raw = ggml.encode(ggml.TQ2_0, codes, torch.tensor([[1.0]]))
    byte = raw[0, 32 + 7].item()
    assert (byte >> 4) & 3 == 2 and byte & 3 == 1
    assert raw[0, 64:].view(torch.float16).item() == 1.0


def test_ptq1_0_trit_packing() -> None:
    """PTQ1_0: 16 bytes of five trits (weights 0..79: weight 16n + m is trit n of byte m), 8 bytes (80..119),
    2 bytes of four (120..127), then d; a byte stores ceil(v * 256 / 243) of its base-3 number v."""
    codes = torch.zeros(1, 128, dtype=torch.int8)
    codes[0, 16 * 0 + 3] = 2  # byte 3, first (most significant) trit
    codes[0, 16 * 4 + 3] = 1  # byte 3, last trit
    raw = ggml.encode(ggml.PTQ1_0, codes, torch.tensor([[2.0]]))
    assert raw.shape == (1, 28)
    v = 2 * 81 + 1
    assert raw[0, 3].item() == (v * 256 + 242) // 243
    assert raw[0, 26:].view(torch.float16).item() == 2.0
    got, _ = ggml.decode(ggml.PTQ1_0, raw, 128)
    assert torch.equal(got, codes)


def test_i2_s_layout() -> None:
    """bitnet.cpp's x86 I2_S: weight j of each 128-chunk in byte j % 32 at bits 6 - 2(j / 32); fp32 scale after."""
    codes = torch.ones(2, 128, dtype=torch.int8)
    codes[1, 32 * 3 + 9] = 2  # chunk 1, byte 9, bits 0-1
    raw = ggml.encode_i2_s(codes, 0.25)
    assert raw.numel() == 256 // 4 + 32
    assert raw[32 + 9].item() == 0b01010110
    assert raw[64:68].view(torch.float32).item() == 0.25
    got, scale = ggml.decode_i2_s(raw, (2, 128))
    assert torch.equal(got, codes) and scale == 0.25


def test_i2_s_code_3_refused() -> None:
    raw = ggml.encode_i2_s(torch.ones(1, 128, dtype=torch.int8), 1.0)
    raw[0] = 0xFF
    with pytest.raises(ggml.GGMLFormatError, match="blk.0.attn_q.weight.*codes equal to 3"):
        ggml.decode_i2_s(raw, (1, 128), "blk.0.attn_q.weight")


def test_wrong_row_bytes_named() -> None:
    with pytest.raises(ggml.GGMLFormatError, match="blk.1.ffn_up.weight.*TQ2_0 rows of 66 bytes"):
        ggml.decode(ggml.TQ2_0, torch.zeros(2, 60, dtype=torch.uint8), 256, "blk.1.ffn_up.weight")


def test_q2_0_group_told_apart_by_bytes() -> None:
    numel = 256 * 4
    assert ggml.by_id(42, numel, numel // 64 * 18) is ggml.Q2_0
    assert ggml.by_id(42, numel, numel // 128 * 34) is ggml.Q2_0_G128
    assert ggml.by_id(42, numel, 7) is None
    assert ggml.by_id(143, numel, None) is ggml.PTQ1_0
