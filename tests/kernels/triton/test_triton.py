"""The Triton kernels against the reference, over a grid of shapes that includes the odd ones.

On a GPU these run directly (and the op, and torch.compile). Without one they
run on the CPU under ``TRITON_INTERPRET=1``, which must be set before Triton
compiles anything: ``test_triton_interpreted.py`` runs this file so.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from conftest import seeded_layer, trit_mlp  # noqa: E402

from trit import format as fmt  # noqa: E402
from trit.kernels import reference, registry  # noqa: E402
from trit.kernels.triton import dequant  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available() and not INTERPRET
DEVICE = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="needs a GPU; on a CPU test_triton_interpreted.py runs this file interpreted"
)

# (N, K, group): N not a multiple of any block, K = 576 (SmolLM2), per-row scales, groups 32..128.
# The interpreter is slow: it takes the first four; the GPU takes them all, and real sizes.
SHAPES = [(40, 576, 64), (72, 576, 32), (33, 256, 128), (64, 96, -1), (48, 576, 128), (40, 576, -1)]
if CUDA:
    SHAPES += [(4096, 4096, 64), (1000, 2880, 64), (6144, 4096, 128), (1536, 8960, -1)]
else:
    SHAPES = SHAPES[:4]
DTYPES = [torch.bfloat16, torch.float16]


def layer(n: int, k: int, group: int, seed: int):
    packed, scale = seeded_layer(n, k, group, seed)
    return packed.to(DEVICE), scale.to(DEVICE)


def inputs(m: int, k: int, n: int, dtype: torch.dtype, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, b


def check(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """bf16 tolerance: relative Frobenius error below 1e-2 (fp16: 2e-3), nothing left unwritten."""
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert torch.isfinite(y).all()
    err = (y.double() - ref.double()).norm() / ref.double().norm()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), f"relative error {err:.2e}"


def reference_out(x, packed, scale, group, bias):
    return reference.linear(x.cpu(), packed.cpu(), scale.cpu(), group, None if bias is None else bias.cpu())


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 4] if CUDA else [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv(n: int, k: int, group: int, m: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import gemv

    packed, scale = layer(n, k, group, seed=n + k)
    x, b = inputs(m, k, n, dtype, bias=m == 3, seed=m)
    one_warp = next(c for c in gemv.CONFIGS if c.num_warps == 1)
    configs = [gemv.GemvConfig(16, 8, 2, 4)] if INTERPRET else [None, gemv.CONFIGS[len(gemv.CONFIGS) // 2], one_warp]
    for cfg in configs:
        y = gemv.gemv(x, packed.view(torch.int32), scale, group, b, cfg)
        check(y.cpu(), reference_out(x, packed, scale, group, b), dtype)


@pytest.mark.parametrize(("group", "block_kw", "mode"),
                         [(48, 16, 0), (32, 16, 1), (128, 4, 2), (64, 4, 2), (-1, 128, 2), (-1, 64, 2)])
def test_gemv_scale_modes(group: int, block_kw: int, mode: int) -> None:
    """Each way a step meets its scales (a word, a group, one for the step), masked tails and split-K included;
    steps of 64 and 128 words add their integer sums 32 words at a time on a GPU."""
    from trit.kernels.triton import gemv

    assert gemv.scale_mode(group, block_kw) == mode
    n, k = 24, 576
    packed, scale = layer(n, k, group, seed=group)
    x, b = inputs(2, k, n, torch.bfloat16, bias=True, seed=group)
    y = gemv.gemv(x, packed.view(torch.int32), scale, group, b, gemv.GemvConfig(8, block_kw, 2, 4))
    check(y.cpu(), reference_out(x, packed, scale, group, b), torch.bfloat16)


@pytest.mark.parametrize(("dtype", "kind"), [(torch.bfloat16, "tiny"), (torch.bfloat16, "outliers"),
                                            (torch.float16, "tiny"), (torch.float16, "large")])
def test_gemv_activations_far_from_one(dtype: torch.dtype, kind: str) -> None:
    """On a GPU the GEMV rounds each step's activations to 14-bit integers against the step's largest: tiny ones,
    large fp16 ones, and bf16 outliers past fp16's range (one input in 97 at 2e5) still come out right."""
    from trit.kernels.triton import gemv

    n, k, group = (256, 4096, 64) if CUDA else (40, 576, 64)
    packed, scale = layer(n, k, group, seed=7)
    x, _ = inputs(1, k, n, dtype, bias=False, seed=3)
    x = x.float()
    if kind == "tiny":
        x *= 1e-3
    elif kind == "large":
        x *= 3e3
    else:
        x[:, ::97] = 2e5 * torch.sign(x[:, ::97])
    x = x.to(dtype)
    y = gemv.gemv(x, packed.view(torch.int32), scale, group)
    check(y.cpu(), reference_out(x, packed, scale, group, None), dtype)


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 17, 300] if CUDA else [1, 17])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm(n: int, k: int, group: int, m: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import gemm

    packed, scale = layer(n, k, group, seed=n + k)
    x, b = inputs(m, k, n, dtype, bias=m == 17, seed=m)
    configs = [None, gemm.configs_for(m, group)[-1]] if CUDA else [None]
    for cfg in configs:
        y = gemm.gemm(x, packed.view(torch.int32), scale, group, b, cfg)
        check(y.cpu(), reference_out(x, packed, scale, group, b), dtype)


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64] if CUDA else [1, 17])
@pytest.mark.parametrize("dtype", DTYPES)
def test_skinny(n: int, k: int, group: int, m: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import skinny

    packed, scale = layer(n, k, group, seed=n + k)
    x, b = inputs(m, k, n, dtype, bias=m == 3, seed=m)
    bk = skinny.block_k_for(group)
    if CUDA:  # the default, and two sub-steps a trip over 128 rows
        configs = [None, skinny.SkinnyConfig(128, bk, 2, 4, 3, 2)]
    else:  # odd splits, and a second sub-step past the last word
        configs = [skinny.SkinnyConfig(64, bk, 2, 4, 1), skinny.SkinnyConfig(64, bk, 3, 4, 1, 2)]
    for cfg in configs:
        y = skinny.skinny(x, packed.view(torch.int32), scale, group, b, cfg)
        check(y.cpu(), reference_out(x, packed, scale, group, b), dtype)


def test_skinny_slots_are_a_permutation() -> None:
    """The activation order the decode implies, worked out in plain Python from the docstring's bit positions."""
    from trit.kernels.triton import skinny

    want = []
    for s in range(64):
        b, h, t, e = s // 16, (s // 8) % 2, (s // 2) % 4, s % 2
        want.append(16 * b + 8 * e + 2 * t + h)
    assert sorted(want) == list(range(64))
    assert skinny.slot_order(64) == want


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant(n: int, k: int, group: int, dtype: torch.dtype) -> None:
    packed, scale = layer(n, k, group, seed=n + k)
    w = dequant.dequantize(packed.view(torch.int32), scale, group, k, dtype)
    want = fmt.dequantize(packed.cpu(), scale.cpu(), k, torch.float32).to(dtype)
    if CUDA:  # one rounding of the same product: bit-exact
        assert torch.equal(w.cpu(), want)
    else:  # the interpreter truncates float32 -> bf16 instead of rounding: one unit in the last place
        torch.testing.assert_close(w.cpu(), want, rtol=2**-7, atol=0)
    x, b = inputs(5, k, n, dtype, bias=True, seed=5)
    check(dequant.linear(x, packed.view(torch.int32), scale, group, b).cpu(), reference_out(x, packed, scale, group, b), dtype)


@pytest.mark.parametrize("cfg", dequant.CONFIGS, ids=str)
def test_dequant_configs(cfg) -> None:
    """Every config of the sweep space writes the same dense weight as the default (rows and words not whole blocks)."""
    for n, k, group in ((40, 576, 64), (33, 256, -1)):
        packed, scale = layer(n, k, group, seed=n)
        want = dequant.dequantize(packed.view(torch.int32), scale, group, k, torch.bfloat16)
        got = dequant.dequantize(packed.view(torch.int32), scale, group, k, torch.bfloat16, config=cfg)
        assert torch.equal(got, want), cfg


@pytest.mark.skipif(not CUDA, reason="the op dispatches to Triton on CUDA tensors only")
@pytest.mark.parametrize("m", [1, 4, 17, 300, 2048])
def test_op_chooses_and_matches(m: int) -> None:

    n, k, group = 1000, 2880, 64
    packed, scale = layer(n, k, group, seed=1)
    x, b = inputs(m, k, n, torch.bfloat16, bias=True, seed=m)
    x3 = x.view(1, m, k)
    y = torch.ops.trit.linear(x3, packed, scale, group, b)
    assert y.shape == (1, m, n)
    check(y.view(m, n).cpu(), reference_out(x, packed, scale, group, b), torch.bfloat16)
    choice = registry.choose_kernel(registry.Problem.of(x3, packed, group))
    assert choice.kernel.name.startswith("triton_")


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_torch_compile_fullgraph_has_no_graph_breaks() -> None:
    torch.manual_seed(0)
    model = trit_mlp(576, 256, 64, torch.bfloat16, "cuda")
    x = torch.randn(3, 576, device="cuda", dtype=torch.bfloat16)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)  # raises on any graph break
    for m in (1, 3, 40):
        xm = torch.randn(m, 576, device="cuda", dtype=torch.bfloat16)
        check(compiled(xm).float().cpu(), model(xm).float().cpu(), torch.bfloat16)
    check(compiled(x).float().cpu(), eager.float().cpu(), torch.bfloat16)


@pytest.mark.parametrize("k", [576, 96, 2880] if CUDA else [576, 96])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_rows_equals_reference(k: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import quantize

    x, _ = inputs(7, k, 1, dtype, bias=False, seed=k)
    x[3] = 0  # an all-zero row: the 1e-5 floor, codes all zero
    q, s = quantize.quantize_rows(x)
    q_ref, s_ref = reference.quantize_activations_int8(x.cpu())
    torch.testing.assert_close(s.cpu(), s_ref[:, 0], rtol=2**-22, atol=0)
    assert (q.cpu().int() - q_ref.int()).abs().max() <= 1  # a tie may round apart (different 1/max rounding)
    # and only a tie: where the codes differ, x * s sits within float rounding of a half
    apart = q.cpu() != q_ref
    v = (x.cpu().float() * s_ref)[apart]
    assert ((v - v.floor() - 0.5).abs() < 1e-4).all(), v


@pytest.mark.parametrize("k", [576, 96, 2880] if CUDA else [576, 96])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_rows_mma_is_the_reference_in_the_fragment_order(k: int, dtype: torch.dtype) -> None:
    """What the int8 wgmma kernel reads: BitNet's codes, each 32 inputs in the k32 fragment's order, zero to the
    layout's padded K, with the scales and the sums of codes (the rounding as :func:`quantize_rows`'s)."""
    from trit.kernels.cuda import wgmma_a8
    from trit.kernels.triton import quantize

    x, _ = inputs(7, k, 1, dtype, bias=False, seed=k + 2)
    x[3] = 0
    wide = torch.cat([x, x], dim=1)[:, :k]  # the row stride is honoured
    k_pad = -(-k // 128) * 128
    q, s, sums = quantize.quantize_rows_mma(wide, k_pad)
    q_ref, s_ref, sums_ref = wgmma_a8.quantize_reference(x.cpu(), k_pad)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=2**-22, atol=0)
    assert torch.equal(sums.cpu(), q.cpu().sum(dim=1, dtype=torch.int32))
    natural = torch.empty_like(q_ref)  # back in the inputs' order: apart from the reference only at a tie
    natural.view(7, -1, 32)[:, :, wgmma_a8.input_order()] = q.cpu().view(7, -1, 32)
    want_q, _ = reference.quantize_activations_int8(x.cpu())
    assert not natural[:, k:].any()
    apart = natural[:, :k] != want_q
    assert (natural[:, :k].int() - want_q.int()).abs().max() <= 1
    v = (x.cpu().float() * s_ref[:, None])[apart]
    assert ((v - v.floor() - 0.5).abs() < 1e-4).all(), v
    assert (sums.cpu() - sums_ref).abs().max() <= apart.sum()
    assert quantize.quantize_rows_mma(x[:0], k_pad)[0].shape == (0, k_pad)


@pytest.mark.parametrize("k", [576, 96, 4096] if CUDA else [576, 96])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fake_quantize_rows_is_one_launch_of_the_reference(k: int, dtype: torch.dtype) -> None:
    """``x_q / s`` in x's dtype, as the reference rounds it: the activations every W1.58A8 kernel without an int8
    path of its own multiplies by (the mma layout's kernels)."""
    from trit.kernels.triton import quantize

    x, _ = inputs(7, k, 1, dtype, bias=False, seed=k + 1)
    x[3] = 0
    wide = torch.cat([x, x], dim=1)[:, :k]  # rows two K apart: the row stride is honoured
    y = quantize.fake_quantize_rows(wide)
    want = reference.fake_quantize_activations_int8(x.cpu())
    assert y.dtype == dtype and y.shape == (7, k) and (y.cpu()[3] == 0).all()
    _, s = reference.quantize_activations_int8(x.cpu())
    # bf16 holds x_q / s within a quarter code (8 bits for |x_q| <= 127), so the codes read back exactly
    codes, want_codes = (y.cpu().float() * s).round(), (want.float() * s).round()
    assert (codes - want_codes).abs().max() <= 1  # at most one code apart, at a tie
    assert (y.cpu() == want).float().mean() > 0.999  # and that only at ties
    assert quantize.fake_quantize_rows(x[:0]).shape == (0, k)


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("m", [64, 300] if CUDA else [5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_a8(n: int, k: int, group: int, m: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import gemm_a8

    if group != -1 and group % 32:
        pytest.skip("the int8 GEMM takes groups that are multiples of 32")
    packed, scale = layer(n, k, group, seed=n + k)
    x, b = inputs(m, k, n, dtype, bias=True, seed=m)
    want = reference.linear_a8(x.cpu(), packed.cpu(), scale.cpu(), group, b.cpu())
    configs = [None, gemm_a8.configs_for(m, group)[-1]] if CUDA else [gemm_a8.GemmA8Config(16, 32, 32, 1, 4, 1)]
    for cfg in configs:
        if cfg is not None and group != -1 and group % cfg.block_k:
            continue
        y = gemm_a8.gemm_a8(x, packed.view(torch.int32), scale, group, b, cfg)
        check(y.cpu(), want, dtype)


@pytest.mark.skipif(not CUDA, reason="the op dispatches to Triton on CUDA tensors only")
@pytest.mark.parametrize("m", [1, 4, 300])
def test_op_with_int8_activations(m: int) -> None:

    n, k, group = 1000, 2560, -1
    packed, scale = layer(n, k, group, seed=2)
    x, b = inputs(m, k, n, torch.bfloat16, bias=False, seed=m)
    y = torch.ops.trit.linear(x, packed, scale, group, None, True)
    check(y.cpu(), reference.linear_a8(x.cpu(), packed.cpu(), scale.cpu(), group), torch.bfloat16)
    name = registry.choose_kernel(registry.Problem.of(x, packed, group, True)).kernel.name
    # by rule (no tuned table names it) the bf16 kernels take x_q / s: the int8 GEMM only where a table measured it
    assert name == ("triton_dequant_cublas" if m >= 128 else "triton_gemv" if m == 1 else "triton_skinny")


@pytest.mark.parametrize(("n", "k"), [(40, 576), (64, 96)] + ([(1536, 8960)] if CUDA else []))
@pytest.mark.parametrize("m", [300] if CUDA else [5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_a8(n: int, k: int, m: int, dtype: torch.dtype) -> None:
    from trit.kernels.triton import gemm_a8

    packed, scale = layer(n, k, -1, seed=n + k)
    x, b = inputs(m, k, n, dtype, bias=True, seed=m)
    want = reference.linear_a8(x.cpu(), packed.cpu(), scale.cpu(), -1, b.cpu())
    configs = [None, *gemm_a8.dense_configs()[1:2]] if CUDA else [gemm_a8.GemmA8Config(16, 32, 32, 1, 4, 1)]
    for cfg in configs:
        check(gemm_a8.dense_a8(x, packed.view(torch.int32), scale, -1, b, cfg).cpu(), want, dtype)
