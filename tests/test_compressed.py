"""The W4A8 compressed-tensors config: what vLLM's scheme check reads, parsed back, and group sizes checked."""

from __future__ import annotations

import pytest

from trit import compressed
from trit.compressed import CHANNEL, W4A8ConfigError, W4A8Scheme, check_group_size, parse_group_size

SHAPES = {  # SmolLM2-like: hidden 576 (not a multiple of 128), intermediate 1536
    "model.layers.0.self_attn.q_proj": (576, 576),
    "model.layers.0.self_attn.o_proj": (576, 576),
    "model.layers.0.mlp.up_proj": (1536, 576),
    "model.layers.0.mlp.down_proj": (576, 1536),
}


@pytest.mark.parametrize("group", [64, CHANNEL])
def test_config_is_the_w4a8_int_scheme_and_parses_back(group: int) -> None:
    d = W4A8Scheme(group).to_dict()
    (cg,) = d["config_groups"].values()
    w, a = cg["weights"], cg["input_activations"]
    assert d["quant_method"] == "compressed-tensors" and d["format"] == "int-quantized" and d["ignore"] == ["lm_head"]
    assert (w["num_bits"], w["type"], w["symmetric"], w["dynamic"]) == (4, "int", True, False)
    assert w["strategy"] == ("channel" if group == CHANNEL else "group")
    assert w["group_size"] == (None if group == CHANNEL else group)
    assert (a["num_bits"], a["type"], a["strategy"], a["dynamic"]) == (8, "int", "token", True)
    assert W4A8Scheme.from_dict(d, "config.json") == W4A8Scheme(group)
    assert compressed.is_w4a8(d) and not compressed.is_w4a8({"quant_method": "trit"}) and not compressed.is_w4a8(None)


def test_config_checked_against_vllms_own_scheme_check() -> None:
    """vLLM's ``_is_dynamic_token_w4a8_int`` accepts the config's weights and activations as written."""
    pytest.importorskip("vllm")
    from compressed_tensors.quantization import QuantizationArgs
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    for group in (64, CHANNEL):
        (cg,) = W4A8Scheme(group).to_dict()["config_groups"].values()
        w, a = QuantizationArgs.model_validate(cg["weights"]), QuantizationArgs.model_validate(cg["input_activations"])
        assert CompressedTensorsConfig._is_dynamic_token_w4a8_int(w, a)


@pytest.mark.parametrize(("path", "value", "named"), [
    (("format",), "pack-quantized", "format"),
    (("config_groups", "group_0", "weights", "num_bits"), 8, "weights.num_bits"),
    (("config_groups", "group_0", "input_activations", "strategy"), "tensor", "input_activations.strategy"),
    (("config_groups", "group_0", "input_activations", "dynamic"), False, "input_activations.dynamic"),
    (("config_groups", "group_0", "weights", "strategy"), "block", "weights.strategy"),
])
def test_other_schemes_are_refused_naming_the_field(path: tuple[str, ...], value, named: str) -> None:
    d = W4A8Scheme(64).to_dict()
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(W4A8ConfigError, match=named.replace(".", r"\.")) as e:
        W4A8Scheme.from_dict(d, "/x/config.json")
    assert "/x/config.json" in str(e.value)


def test_group_size_that_does_not_divide_is_refused_naming_layers_and_fits() -> None:
    check_group_size(SHAPES, 64)
    check_group_size(SHAPES, CHANNEL)
    with pytest.raises(W4A8ConfigError) as e:
        check_group_size(SHAPES, 128)
    msg = str(e.value)
    assert "model.layers.0.self_attn.q_proj (K=576)" in msg and "3 of 4 layers" in msg
    assert "model.layers.0.mlp.down_proj" not in msg  # K=1536 is a multiple of 128
    assert "sizes that fit every layer: 32, 64, channel" in msg


def test_tensor_parallel_checks_each_ranks_slice_of_row_parallel_layers() -> None:
    check_group_size(SHAPES, 64, tensor_parallel=3)  # 576 / 3 = 192, 1536 / 3 = 512: whole groups of 64
    with pytest.raises(W4A8ConfigError) as e:
        check_group_size(SHAPES, 64, tensor_parallel=4)  # o_proj: 576 / 4 = 144, not a multiple of 64
    assert "model.layers.0.self_attn.o_proj (K=576, 144 a rank)" in str(e.value)
    assert "--tensor-parallel-size 4" in str(e.value) and "q_proj" not in str(e.value)


def test_parse_group_size() -> None:
    assert parse_group_size("64") == 64 and parse_group_size("channel") == CHANNEL
    for bad in ("0", "-3", "wide"):
        with pytest.raises(W4A8ConfigError, match="--group-size"):
            parse_group_size(bad)
