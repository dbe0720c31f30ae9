"""The format: the bit layout drawn in trit/format.py, the exact round trip, the config, validation."""

from __future__ import annotations

import pytest
import torch
from conftest import dense_weight, make_layer
from hypothesis import given, settings
from hypothesis import strategies as st

from trit import format as fmt


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(n: int, k4: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, 4 * k4), generator=g, dtype=torch.int8)
    packed = fmt.pack(values)
    assert packed.dtype == torch.uint8 and packed.shape == (n, k4)
    assert torch.equal(fmt.unpack(packed), values)
    assert fmt.count_invalid_codes(packed) == 0


def test_layout_as_drawn() -> None:
    # k = 0..3 hold -1, 0, 1, 1 -> codes 0, 1, 2, 2 in bits 0-1, 2-3, 4-5, 6-7
    packed = fmt.pack(torch.tensor([[-1, 0, 1, 1]]))
    assert packed.tolist() == [[0b10_10_01_00]]


def test_int32_word_view_is_the_same_layout() -> None:
    values = torch.randint(-1, 2, (3, 64), dtype=torch.int8)
    words = fmt.pack(values).view(torch.int32)  # (3, 4): word k // 16 holds k in bits 2 * (k % 16)
    for k in range(64):
        code = (words[:, k // 16] >> (2 * (k % 16))) & 3
        assert torch.equal(code.to(torch.int8) - 1, values[:, k])


def test_pack_refuses_k_not_multiple_of_4() -> None:
    with pytest.raises(fmt.FormatError, match="multiple of 4"):
        fmt.pack(torch.zeros(2, 6, dtype=torch.int8))


def test_count_invalid_codes() -> None:
    packed = torch.tensor([[0b11_00_00_00, 0b00_11_11_01]], dtype=torch.uint8)
    assert fmt.count_invalid_codes(packed) == 3


@pytest.mark.parametrize(("k", "group", "k_pad"), [(576, 64, 576), (576, 128, 640), (10, -1, 12), (96, 32, 96), (100, 12, 108)])
def test_padded_k(k: int, group: int, k_pad: int) -> None:
    assert fmt.padded_k(k, group) == k_pad


def test_config_round_trip() -> None:
    cfg = fmt.TritConfig(group_size=128, scale_dtype=fmt.ScaleDtype.BFLOAT16, method="twn",
                         modules_not_converted=("lm_head",), extra={"note": 1})
    d = cfg.to_dict()
    assert d["quant_method"] == "trit" and d["format_version"] == 1
    back = fmt.TritConfig.from_dict(d)
    assert back == cfg and back.extra == {"note": 1}
    assert not back.is_converted("lm_head") and back.is_converted("model.layers.0.mlp.up_proj")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format_version": 2}, r"format_version: expected 1 .*found 2"),
        ({"quant_method": "gptq"}, r"quant_method: expected 'trit'"),
        ({"group_size": 30}, r"group_size: expected -1 .* multiple of 4"),
        ({"group_size": "64"}, r"group_size: expected an integer"),
        ({"scale_dtype": "float8"}, r"scale_dtype: expected one of"),
        ({"modules_not_converted": "lm_head"}, r"modules_not_converted: expected a list"),
    ],
)
def test_config_refuses(change: dict, match: str) -> None:
    d = {**fmt.TritConfig().to_dict(), **change}
    with pytest.raises(fmt.FormatError, match=match):
        fmt.TritConfig.from_dict(d)


def test_config_refuses_missing_version() -> None:
    d = fmt.TritConfig().to_dict()
    del d["format_version"]
    with pytest.raises(fmt.FormatError, match="format_version: expected 1, found no such key"):
        fmt.TritConfig.from_dict(d)


def _layer(n: int = 8, k: int = 64, group: int = 32):
    packed = fmt.pack(torch.randint(-1, 2, (n, fmt.padded_k(k, group))))
    scale = torch.rand(n, fmt.padded_k(k, group) // group, dtype=torch.float16) + 0.1
    return packed, scale


def test_check_layer_accepts_a_good_layer() -> None:
    packed, scale = _layer()
    fmt.check_layer("l", packed, scale, 32, 8, 64)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda p, s: (p | 0b11, s), r"l\.weight_packed: expected 2-bit codes in \{0, 1, 2\}, found 128 codes equal to 3"),
        (lambda p, s: (p, s[:, :1]), r"l\.weight_scale: expected shape \(8, 2\)"),
        (lambda p, s: (p[:, :-1], s), r"l\.weight_packed: expected shape \(8, 16\)"),
        (lambda p, s: (p.to(torch.int16), s), r"weight_packed: expected dtype uint8, found int16"),
        (lambda p, s: (p, s.double()), r"weight_scale: expected dtype float16, bfloat16 or float32"),
        (lambda p, s: (p, s.index_fill(1, torch.tensor([0]), float("nan"))), r"expected finite scales, found 8 NaN"),
        (lambda p, s: (p, -s), r"expected positive scales, found 16 zero or negative"),
    ],
)
def test_check_layer_refuses(edit, match: str) -> None:
    packed, scale = edit(*_layer())
    with pytest.raises(fmt.FormatError, match=match):
        fmt.check_layer("l", packed, scale, 32, 8, 64)


def test_to_scale_lifts_zero_and_refuses_overflow() -> None:
    out = fmt.to_scale(torch.tensor([[0.0, 1.0]]), fmt.ScaleDtype.FLOAT16, "l")
    assert out.dtype == torch.float16 and (out > 0).all()
    with pytest.raises(fmt.FormatError, match="overflow"):
        fmt.to_scale(torch.tensor([[1e6]]), fmt.ScaleDtype.FLOAT16, "l")


def test_planes_in_the_config() -> None:
    cfg = fmt.TritConfig.from_dict({"quant_method": "trit", "format_version": 1, "group_size": 64, "planes": 2})
    assert cfg.planes == 2 and cfg.to_dict()["planes"] == 2
    assert fmt.TritConfig.from_dict({"quant_method": "trit", "format_version": 1, "group_size": 64}).planes == 1
    with pytest.raises(fmt.FormatError, match="quantization_config.planes: expected 1 to 2, found 3"):
        fmt.TritConfig.from_dict({"quant_method": "trit", "format_version": 1, "group_size": 64, "planes": 3})


def test_layer_planes_name_the_layers_with_another_count() -> None:
    base = {"quant_method": "trit", "format_version": 1, "group_size": 64}
    two = {"model.layers.0.mlp.down_proj": 2, "model.layers.1.self_attn.q_proj": 2,
           "model.layers.1.self_attn.k_proj": 2, "model.layers.1.self_attn.v_proj": 2}
    cfg = fmt.TritConfig.from_dict(base | {"layer_planes": two})
    assert cfg.to_dict()["layer_planes"] == two and fmt.TritConfig.from_dict(cfg.to_dict()) == cfg
    assert "layer_planes" not in fmt.TritConfig.from_dict(base).to_dict()
    assert cfg.max_planes == 2 and fmt.TritConfig.from_dict(base).max_planes == 1
    assert cfg.planes_of("model.layers.0.mlp.down_proj") == 2 and cfg.planes_of("model.layers.0.mlp.up_proj") == 1
    # the fused layers vLLM loads take their parts' count
    assert cfg.planes_of("model.layers.1.self_attn.qkv_proj") == 2 and cfg.planes_of("model.layers.0.self_attn.qkv_proj") == 1
    assert cfg.planes_of("model.layers.0.mlp.gate_up_proj") == 1
    split = fmt.TritConfig.from_dict(base | {"layer_planes": {"model.layers.0.mlp.gate_proj": 2}})
    with pytest.raises(fmt.FormatError, match=r"model.layers.0.mlp.gate_up_proj: expected one plane count for the "
                                              r"layers vLLM fuses into one, found \[1, 2\]"):
        split.planes_of("model.layers.0.mlp.gate_up_proj")
    with pytest.raises(fmt.FormatError, match=r"layer_planes\['model.layers.0.mlp.up_proj'\]: expected 1 to 2, found 3"):
        fmt.TritConfig.from_dict(base | {"layer_planes": {"model.layers.0.mlp.up_proj": 3}})
    with pytest.raises(fmt.FormatError, match="layer_planes: expected an object of module name: plane count"):
        fmt.TritConfig.from_dict(base | {"layer_planes": [2]})
    assert fmt.plane_suffixes(2) == [("weight_packed", "weight_scale"), ("weight_packed_2", "weight_scale_2")]
    assert fmt.layer_names(["a.weight_packed_2", "b.weight_scale", "c.weight"]) == ["a", "b"]


def test_the_lm_head_choice_in_the_config() -> None:
    base = {"quant_method": "trit", "format_version": 1, "group_size": 64}
    assert fmt.TritConfig.from_dict(base).lm_head == "stored"
    assert "lm_head" not in fmt.TritConfig.from_dict(base).to_dict()  # the default is not written
    cfg = fmt.TritConfig.from_dict({**base, "lm_head": "int8"})
    assert cfg.lm_head == "int8" and cfg.to_dict()["lm_head"] == "int8" and not cfg.extra
    with pytest.raises(fmt.FormatError, match="quantization_config.lm_head: expected one of 'stored', 'int8', "
                                              "found 'fp8'"):
        fmt.TritConfig.from_dict({**base, "lm_head": "fp8"})


@pytest.mark.parametrize(("n", "k", "group"), [(8, 64, 32), (5, 576, 64), (7, 576, 128), (3, 20, -1), (4, 100, 12)])
def test_dequantize_is_the_format(n: int, k: int, group: int) -> None:
    values, packed, scale = make_layer(n, k, group)
    w = fmt.dequantize(packed, scale, k, torch.float64)
    torch.testing.assert_close(w, dense_weight(values, scale, k), rtol=0, atol=0)
