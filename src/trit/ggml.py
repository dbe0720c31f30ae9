"""The ternary block formats of GGUF files, as bytes in and codes and scales out (and back).

Each format stores a row of K weights as K / B blocks of B weights, every block
its own fp16 scale ``d``, each weight a code whose value is ``(code - 1) * d``.
Layouts, from ggml's ``ggml-common.h`` / ``ggml-quants.c`` (mainline llama.cpp,
2026-10), PrismML's llama.cpp fork (Ternary-Bonsai) and microsoft/BitNet's
``ggml-bitnet-mad.cpp``; docs/formats.md says what was checked against what.

========  ====  =====  =======================================================================
format    B     bytes  layout of a block
========  ====  =====  =======================================================================
Q2_0      64    18     ``d`` first, then 16 bytes: weight j in bits 2(j % 4) of byte j / 4
                       (trit's own packing); codes 0..3 are -1, 0, +1, +2
PQ2_0     128   34     the same in blocks of 128 (Prism; legacy Prism files store it as Q2_0's id)
TQ2_0     256   66     64 bytes, then ``d``: weight e in byte 32(e / 128) + e % 32, bits 2((e % 128) / 32)
TQ1_0     256   54     five trits a byte (base 3, the first most significant, stored as
                       ceil(v * 256 / 243)): 32 bytes hold weights 0..159 (weight 32n + m in
                       byte m, trit n), 16 bytes 160..239, 4 bytes four trits each
                       (240..255), then ``d``
PTQ1_0    128   28     TQ1_0's codec in blocks of 128: 16 bytes (0..79), 8 (80..119), 2 (120..127),
                       then ``d`` (Prism)
I2_S      128   32     bitnet.cpp (x86): the whole tensor flattened, weight j of a 128-chunk in byte
                       j % 32 at bits 6 - 2(j / 32); codes 0, 1, 2 are -1, 0, +1; one fp32 scale for
                       the tensor at byte n / 4, in a 32-byte tail
========  ====  =====  =======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trit import format as fmt


class GGMLFormatError(fmt.FormatError):
    """Bytes that are not the block format they claim to be; names the tensor."""


@dataclass(frozen=True)
class BlockFormat:
    name: str
    type_id: int  # ggml_type (PrismML's and bitnet.cpp's ids are their forks')
    block: int  # weights a block
    block_bytes: int
    fork: str = ""  # "" for mainline llama.cpp, else the fork that defines it

    def row_bytes(self, k: int) -> int:
        return k // self.block * self.block_bytes


Q2_0 = BlockFormat("Q2_0", 42, 64, 18)
PQ2_0 = BlockFormat("PQ2_0", 142, 128, 34, "PrismML")
Q2_0_G128 = BlockFormat("Q2_0 (legacy Prism, group 128)", 42, 128, 34, "PrismML")
TQ2_0 = BlockFormat("TQ2_0", 35, 256, 66)
TQ1_0 = BlockFormat("TQ1_0", 34, 256, 54)
PTQ1_0 = BlockFormat("PTQ1_0", 143, 128, 28, "PrismML")
I2_S = BlockFormat("I2_S", 36, 128, 32, "bitnet.cpp")
FORMATS = (Q2_0, PQ2_0, Q2_0_G128, TQ2_0, TQ1_0, PTQ1_0, I2_S)

# TQ1_0-style segments: (bytes, trits a byte) in order; weight (base + n * bytes + m) is trit n of byte m
_TRIT_SEGMENTS = {"TQ1_0": ((32, 5), (16, 5), (4, 4)), "PTQ1_0": ((16, 5), (8, 5), (2, 4))}
_POW3 = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int32)


def _scales(d: torch.Tensor) -> torch.Tensor:  # (..., 2) uint8 -> (...) float16
    return d.contiguous().view(torch.float16)[..., 0]


def _pairs_to_codes(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Bytes (..., n / 4) holding 2-bit codes, weight j in bits 2(j % 4) of byte j / 4 -> codes (..., n)."""
    shifts = torch.arange(0, 8, 2, dtype=torch.int32)
    return ((qs.to(torch.int32)[..., None] >> shifts) & 3).reshape(*qs.shape[:-1], n)


def _codes_to_pairs(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], -1, 4)
    return (c[..., 0] | c[..., 1] << 2 | c[..., 2] << 4 | c[..., 3] << 6).to(torch.uint8)


def _trits_of(byte: torch.Tensor, count: int) -> torch.Tensor:
    """Trit n (0: most significant) of each byte, n < count: (((byte * 3^n) mod 256) * 3) >> 8, as ggml reads them."""
    b = byte.to(torch.int32)[..., None]
    return (((b * _POW3[:count]) & 0xFF) * 3) >> 8  # (..., count)


def _byte_of(trits: torch.Tensor) -> torch.Tensor:
    """Trits (..., count), the first most significant, -> the byte ggml stores: ceil(v * 256 / 243) of the 5-trit
    number v (a 4-trit group is scaled by 3 first)."""
    count = trits.shape[-1]
    v = (trits.to(torch.int32) * _POW3[:count].flip(0)).sum(-1) * 3 ** (5 - count)
    return ((v * 256 + 242) // 243).to(torch.uint8)


def _trit_blocks_decode(fmt_: BlockFormat, blocks: torch.Tensor) -> torch.Tensor:  # (..., bytes) -> (..., B)
    out, offset = [], 0
    for nbytes, count in _TRIT_SEGMENTS[fmt_.name]:
        trits = _trits_of(blocks[..., offset:offset + nbytes], count)  # (..., nbytes, count)
        out.append(trits.transpose(-1, -2).reshape(*blocks.shape[:-1], nbytes * count))  # weight n * nbytes + m
        offset += nbytes
    return torch.cat(out, -1)


def _trit_blocks_encode(fmt_: BlockFormat, codes: torch.Tensor) -> torch.Tensor:  # (..., B) -> (..., bytes - 2)
    out, start = [], 0
    for nbytes, count in _TRIT_SEGMENTS[fmt_.name]:
        part = codes[..., start:start + nbytes * count].reshape(*codes.shape[:-1], count, nbytes)
        out.append(_byte_of(part.transpose(-1, -2)))
        start += nbytes * count
    return torch.cat(out, -1)


def decode(fmt_: BlockFormat, data: torch.Tensor, k: int, name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """A matrix's bytes ``(N, K / B * bytes)`` uint8 -> codes ``(N, K)`` int8 (``value = code - 1``) and block scales
    ``(N, K / B)`` float16. I2_S: see :func:`decode_i2_s`."""
    n = data.shape[0]
    if k % fmt_.block or data.shape[-1] != fmt_.row_bytes(k):
        raise GGMLFormatError(name, f"{fmt_.name} rows of {fmt_.row_bytes(k)} bytes ({k} weights in blocks of "
                              f"{fmt_.block})", f"{tuple(data.shape)} bytes")
    blocks = data.reshape(n, k // fmt_.block, fmt_.block_bytes)
    if fmt_ in (Q2_0, PQ2_0, Q2_0_G128):
        d, codes = blocks[..., :2], _pairs_to_codes(blocks[..., 2:], fmt_.block)
    elif fmt_ is TQ2_0:
        qs = blocks[..., :64].reshape(n, -1, 2, 32).to(torch.int32)  # half c, byte m
        shifts = torch.arange(0, 8, 2, dtype=torch.int32).view(1, 1, 1, 4, 1)
        codes = ((qs[..., None, :] >> shifts) & 3).reshape(n, -1, 256)  # (c, l, m): weight 128c + 32l + m
        d = blocks[..., 64:]
    elif fmt_ in (TQ1_0, PTQ1_0):
        codes, d = _trit_blocks_decode(fmt_, blocks[..., :-2]), blocks[..., -2:]
    else:
        raise ValueError(f"{fmt_.name} is not a per-block format")
    return codes.reshape(n, k).to(torch.int8), _scales(d)


def encode(fmt_: BlockFormat, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes ``(N, K)`` (``code = value + 1``, 0..2, or 0..3 for the Q2_0 family) and block scales ``(N, K / B)``
    float16 -> the matrix's bytes ``(N, K / B * bytes)`` uint8."""
    n, k = codes.shape
    blocks = codes.reshape(n, k // fmt_.block, fmt_.block)
    d = scales.to(torch.float16).contiguous().view(torch.uint8).reshape(n, k // fmt_.block, 2)
    if fmt_ in (Q2_0, PQ2_0, Q2_0_G128):
        out = torch.cat([d, _codes_to_pairs(blocks)], -1)
    elif fmt_ is TQ2_0:
        c = blocks.to(torch.int32).reshape(n, -1, 2, 4, 32)  # (c, l, m)
        qs = c[..., 0, :] | c[..., 1, :] << 2 | c[..., 2, :] << 4 | c[..., 3, :] << 6
        out = torch.cat([qs.reshape(n, -1, 64).to(torch.uint8), d], -1)
    elif fmt_ in (TQ1_0, PTQ1_0):
        out = torch.cat([_trit_blocks_encode(fmt_, blocks), d], -1)
    else:
        raise ValueError(f"{fmt_.name} is not a per-block format")
    return out.reshape(n, -1)


def i2_s_bytes(numel: int) -> int:
    """An I2_S tensor's bytes: a quarter byte a weight, then a 32-byte tail holding the fp32 scale."""
    return numel // 4 + 32


def decode_i2_s(data: torch.Tensor, shape: tuple[int, int], name: str = "tensor") -> tuple[torch.Tensor, float]:
    """bitnet.cpp's x86 I2_S bytes -> codes ``shape`` int8 (``value = code - 1``) and the tensor's scale."""
    numel = shape[0] * shape[1]
    if numel % 128 or data.numel() != i2_s_bytes(numel):
        raise GGMLFormatError(name, f"I2_S: {i2_s_bytes(numel)} bytes for {shape[0]} x {shape[1]} weights (a "
                              "multiple of 128)", f"{data.numel()} bytes")
    qs = data[:numel // 4].reshape(-1, 32).to(torch.int32)
    shifts = torch.tensor([6, 4, 2, 0], dtype=torch.int32).view(1, 4, 1)
    codes = (qs[:, None, :] >> shifts) & 3  # (chunk, j // 32, j % 32)
    if (codes == 3).any():
        raise GGMLFormatError(name, "I2_S codes 0, 1, 2", f"{int((codes == 3).sum())} codes equal to 3")
    scale = float(data[numel // 4:numel // 4 + 4].contiguous().view(torch.float32)[0])
    return codes.reshape(shape).to(torch.int8), scale


def encode_i2_s(codes: torch.Tensor, scale: float) -> torch.Tensor:
    """Codes (N, K) in 0..2 and the tensor's scale -> I2_S bytes (the tail's other 28 bytes zero)."""
    c = codes.reshape(-1, 4, 32).to(torch.int32)
    out = torch.zeros(i2_s_bytes(codes.numel()), dtype=torch.uint8)
    out[:codes.numel() // 4] = (c[:, 0] << 6 | c[:, 1] << 4 | c[:, 2] << 2 | c[:, 3]).to(torch.uint8).reshape(-1)
    out[codes.numel() // 4:codes.numel() // 4 + 4] = torch.tensor([scale], dtype=torch.float32).view(torch.uint8)
    return out


def by_id(type_id: int, numel: int, nbytes: int | None) -> BlockFormat | None:
    """The ternary format of a tensor of ``type_id`` holding ``numel`` weights in ``nbytes`` (None: unknown size);
    mainline Q2_0 (group 64) and legacy Prism Q2_0 (group 128) share id 42 and differ in bytes a weight."""
    if type_id == 42 and nbytes is not None and nbytes != numel // 64 * 18:
        return Q2_0_G128 if nbytes == numel // 128 * 34 else None
    return next((f for f in FORMATS if f.type_id == type_id and f is not Q2_0_G128), None)
