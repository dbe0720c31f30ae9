"""The L2 prefetch's links (``trit/kernels/cuda/prefetch.py``): which layers prefetch which, within the budget,
and what the kernels are handed; on the CPU, with tensors standing in for a loaded model's."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from trit.kernels.cuda import mma, prefetch

MB = 2**20


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(prefetch.ENV, raising=False)
    prefetch.reset()
    yield
    prefetch.reset()


def _layer(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, codes) of a layer whose codes take ``nbytes`` (scales a ninth of that)."""
    return torch.zeros(max(1, nbytes // 9), dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


@pytest.mark.parametrize(("raw", "want"), [(None, 0), ("", 0), ("0", 0), ("24", 24 * MB), ("0.5", MB // 2)])
def test_the_budget_is_megabytes_and_off_by_default(monkeypatch: pytest.MonkeyPatch, raw, want) -> None:
    if raw is not None:
        monkeypatch.setenv(prefetch.ENV, raw)
    assert prefetch.budget_bytes() == want


@pytest.mark.parametrize("raw", ["lots", "-1", "nan", "inf"])
def test_a_budget_that_is_not_megabytes_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(prefetch.ENV, raw)
    with pytest.raises(ValueError, match=f"{prefetch.ENV}={raw!r}: expected megabytes"):
        prefetch.budget_bytes()


@pytest.mark.parametrize(("name", "source"), [
    ("model.layers.0.self_attn.qkv_proj", True), ("model.layers.3.self_attn.v_proj", True),
    ("model.layers.3.self_attn.q_proj", True), ("model.layers.0.self_attn.o_proj", False),
    ("model.layers.0.mlp.gate_up_proj", False), ("transformer.h.0.attn.c_attn", True),
    ("gpt_neox.layers.0.attention.query_key_value", True), ("model.layers.0.mlp.down_proj", False),
    ("transformer.blocks.0.attn.Wqkv", True),
])
def test_the_projections_attention_reads_can_be_sources(name: str, source: bool) -> None:
    assert prefetch.is_source(name) is source


def test_each_attention_input_prefetches_what_follows_within_its_budget() -> None:
    """vLLM's Llama order: qkv, o, gate_up, down a layer. qkv's table holds o (scales, codes), then gate_up's
    scales and as much of its codes as the budget leaves; down and the next layer's qkv are not taken; each
    layer's qkv has its own table; the other layers none."""
    budget = 3 * MB
    layers = []
    for i in range(2):
        qkv, o, gate_up, down = _layer(MB // 2), _layer(MB // 4), _layer(4 * MB), _layer(2 * MB)
        layers.append((qkv, o, gate_up, down))
        for name, (sc, codes) in zip(("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"),
                                     (qkv, o, gate_up, down), strict=True):
            source = codes if name.endswith("qkv_proj") else None
            prefetch.loaded(f"model.layers.{i}.{name}", source, [sc, codes], budget)
    for qkv, o, gate_up, down in layers:
        ranges = prefetch.table(qkv[1])
        assert all(start % prefetch.LINE == 0 and n % prefetch.LINE == 0 and n > 0 for start, n in ranges)
        assert sum(n for _, n in ranges) <= budget and sum(n for _, n in ranges) > budget - 4 * prefetch.LINE
        covered = [(s, s + n) for s, n in ranges]
        # in order: o's scales, o's codes, gate_up's scales, then the start of gate_up's codes
        for (s, e), t in zip(covered, (o[0], o[1], gate_up[0], gate_up[1]), strict=True):
            lo, hi = _span(t)
            assert s <= lo < s + prefetch.LINE and e <= hi
        assert covered[3][1] < _span(gate_up[1])[1]  # gate_up's codes only in part
        for t in (o[1], gate_up[1], down[1]):
            assert prefetch.table(t) == [] and prefetch.table_ptr(t) == 0
    assert prefetch.table_ptr(layers[0][0][1]) != 0


def test_a_source_stops_at_the_next_source_and_off_links_nothing() -> None:
    qkv0, o0, qkv1 = _layer(MB), _layer(MB), _layer(MB)
    prefetch.loaded("l.0.self_attn.qkv_proj", qkv0[1], list(qkv0), 64 * MB)
    prefetch.loaded("l.0.self_attn.o_proj", None, list(o0), 64 * MB)
    prefetch.loaded("l.1.self_attn.qkv_proj", qkv1[1], list(qkv1), 64 * MB)
    assert len(prefetch.table(qkv0[1])) == 2  # o's two tensors, not the next qkv's
    prefetch.reset()
    prefetch.loaded("l.0.self_attn.qkv_proj", qkv0[1], list(qkv0), 0)
    prefetch.loaded("l.0.self_attn.o_proj", None, list(o0), 0)
    assert prefetch.table_ptr(qkv0[1]) == 0 and not prefetch._TABLES
    # a source whose CUDA kernels do not run it (format v1: no codes of the layout) gets no table
    prefetch.loaded("l.0.self_attn.qkv_proj", None, list(qkv0), MB)
    prefetch.loaded("l.0.self_attn.o_proj", None, list(o0), MB)
    assert not prefetch._TABLES


def test_a_table_goes_with_its_source_and_then_lets_its_targets_go() -> None:
    qkv, o = _layer(MB), _layer(MB)
    prefetch.loaded("l.0.self_attn.qkv_proj", qkv[1], list(qkv), 8 * MB)
    prefetch.loaded("l.0.self_attn.o_proj", None, list(o), 8 * MB)
    next_qkv = _layer(MB)
    prefetch.loaded("l.1.self_attn.qkv_proj", next_qkv[1], list(next_qkv), 8 * MB)  # the chain has moved on
    target = weakref.ref(o[1].untyped_storage())
    del o
    gc.collect()
    assert target() is not None  # the table keeps the memory it points at alive
    source = qkv[1]
    del qkv
    gc.collect()
    assert prefetch.table_ptr(source) != 0
    del source
    gc.collect()
    assert not prefetch._TABLES and target() is None


def test_a_runtime_model_links_in_module_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' Llama with separate q, k, v: each v_proj prefetches o_proj and the MLP after it (the mma
    layout forced on the CPU, as the runtime's loader repacks on a GPU)."""
    from transformers import LlamaConfig

    from trit import format as fmt
    from trit.nn import TritLinear, layer_tensors, link_prefetch
    from trit.synthetic import random_model

    monkeypatch.setenv("TRIT_LAYOUT", "mma")
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    model = random_model(config, fmt.TritConfig(group_size=64), dtype=torch.float32)
    assert link_prefetch(model, budget=MB) == 2  # no budget from the environment: nothing linked at tile
    mods = dict(model.named_modules())
    for i in range(2):
        v = mods[f"model.layers.{i}.self_attn.v_proj"]
        o = mods[f"model.layers.{i}.self_attn.o_proj"]
        assert isinstance(v, TritLinear) and v.tiled
        ranges = prefetch.table(layer_tensors(v)[0])
        first = layer_tensors(o)[1][0]
        assert ranges[0][0] == first.data_ptr() // prefetch.LINE * prefetch.LINE
        # o, gate, up and down (scales and codes each) all fit in a megabyte here; the next layer's q_proj starts
        # the next block
        assert len(ranges) == 8
    for name in ("q_proj", "k_proj", "o_proj"):
        assert prefetch.table_ptr(layer_tensors(mods[f"model.layers.0.self_attn.{name}"])[0]) == 0


def test_the_last_projection_of_a_block_on_the_cuda_kernels_is_its_source() -> None:
    """q, k and v apart, only q in the mma layout (k and v, smaller, stay in format v1): q prefetches o and the MLP
    (not k and v, which attention reads before); the next block's projections end the chain even without codes."""
    q, k, v, o, mlp, q1 = _layer(MB), _layer(MB // 4), _layer(MB // 4), _layer(MB), _layer(MB), _layer(MB)
    prefetch.loaded("l.0.self_attn.q_proj", q[1], list(q), 64 * MB)
    prefetch.loaded("l.0.self_attn.k_proj", None, list(k), 64 * MB)
    prefetch.loaded("l.0.self_attn.v_proj", None, list(v), 64 * MB)
    prefetch.loaded("l.0.self_attn.o_proj", None, list(o), 64 * MB)
    prefetch.loaded("l.0.mlp.down_proj", None, list(mlp), 64 * MB)
    prefetch.loaded("l.1.self_attn.q_proj", None, list(q1), 64 * MB)
    prefetch.loaded("l.1.mlp.down_proj", None, list(_layer(MB)), 64 * MB)
    starts = [start for start, _ in prefetch.table(q[1])]
    assert starts == [t.data_ptr() // prefetch.LINE * prefetch.LINE for t in (*o, *mlp)]


def test_the_kernels_are_handed_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """mma.launch passes a layer's table (0 where it has none) as the parameter after the split-K counters."""
    seen = []

    class Kern:
        def launch(self, grid, block, smem, signature, values):
            seen.append((signature, values))

    ws = (torch.zeros(1), torch.zeros(1))
    monkeypatch.setattr(mma, "workspace", lambda device, floats, locks: ws)
    r = mma.MmaWeights(torch.zeros(3, 1, 32, 4, dtype=torch.int32), torch.zeros(3, 1, 8, dtype=torch.int32), 40, 128,
                       128)
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    mma.launch(Kern(), x, r, 1, 1, 1, 1, 4, 0)
    monkeypatch.setattr(prefetch, "_TABLES", {r.wq.data_ptr(): torch.zeros(3, dtype=torch.int64)})
    mma.launch(Kern(), x, r, 1, 1, 1, 1, 4, 0)
    (sig, plain), (_, linked) = seen
    assert len(sig) == len(plain) == 14 and sig[6] == "P"
    assert plain[6] == 0 and linked[6] == prefetch._TABLES[r.wq.data_ptr()].data_ptr()
    assert plain[:3] == linked[:3] and plain[4:6] == linked[4:6] and plain[7:] == linked[7:]  # [3]: each call's y


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and NVRTC")


@gpu
@pytest.mark.parametrize(("kernel", "m"), [("cuda_gemv", 1), ("cuda_imma", 4), ("cuda_mma", 16), ("cuda_wgmma", 64)])
def test_a_kernel_that_prefetches_computes_what_it_did(kernel: str, m: int) -> None:
    """Each kernel of the layout, built with the prefetch and handed a table of another layer's bytes, gives the
    result of its plain build: exactly, one K split (the split-K sums add in no fixed order)."""
    from trit.kernels.cuda import gemv, imma, launch, wgmma
    from trit.synthetic import random_packed

    if launch.unavailable() is not None:
        pytest.skip(launch.unavailable())
    if kernel == "cuda_wgmma" and wgmma.supported(torch.device("cuda")) is not None:
        pytest.skip("needs an sm_90 GPU")
    n, k, g = 4096, 4096, 64
    layers = []
    for _ in range(2):
        packed = random_packed((n, k // 4), "cuda")
        scale = (torch.rand(n, k // g, device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
        layers.append(mma.repack(packed, scale, g, k))
    src, dst = layers
    prefetch.loaded("l.0.self_attn.qkv_proj", src.wq, [src.sc, src.wq], 4 * MB)
    prefetch.loaded("l.0.self_attn.o_proj", None, [dst.sc, dst.wq], 4 * MB)
    assert prefetch.table_ptr(src.wq) != 0
    plan, cfg = {"cuda_gemv": (gemv.plan, gemv.GemvConfig(splits=1)), "cuda_imma": (imma.plan, imma.ImmaConfig()),
                 "cuda_mma": (mma.plan, mma.MmaConfig(splits=1)),
                 "cuda_wgmma": (wgmma.plan, wgmma.WgmmaConfig(ntok=64, splits=1))}[kernel]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    plain_plan, l2_plan = plan(m, src, cfg, x.device), plan(m, src, cfg, x.device, l2=True)
    assert plain_plan.kern is not l2_plan.kern  # two builds
    plain = mma.run(plain_plan, x, src)  # the plain build ignores the table it is handed
    with_l2 = mma.run(l2_plan, x, src)
    torch.cuda.synchronize()
    assert torch.equal(plain, with_l2)
