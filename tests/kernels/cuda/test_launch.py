"""The CUDA candidates through ``trit::linear_tiled`` on a GPU: each size goes to its kernel and equals the
file layout's result (the refusals themselves are checked on the CPU in ``tests/kernels/test_registry.py``)."""

from __future__ import annotations

import pytest
import torch

import trit.ops  # noqa: F401  (registers trit::linear_tiled)
from trit import format as fmt
from trit.kernels import registry
from trit.kernels.cuda import launch, mma, wgmma
from trit.kernels.reference import linear as ref_linear
from trit.synthetic import random_packed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or launch.unavailable() is not None,
                                reason="needs a GPU and NVRTC")


@pytest.mark.parametrize(("n", "k", "g"), [(4098, 576, 64), (130, 256, 32), (33, 192, fmt.PER_ROW), (50, 640, 128)])
@pytest.mark.parametrize("m", [1, 3, 17, 100, 300])
def test_each_size_runs_its_kernel_and_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    kp = fmt.padded_k(k, g)
    packed = random_packed((n, kp // 4), "cuda")
    scale = (torch.rand(n, fmt.num_groups(g, kp), device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
    r = mma.repack(packed, scale, g, k)
    x = torch.randn(2, m, k, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    problem = registry.Problem(2 * m, n, k, g, "cuda", torch.bfloat16, layout="mma")
    chosen = registry.choose_kernel(problem).kernel.name
    hopper = launch._wgmma_support(torch.cuda.current_device()) is None
    want_kernel = ("cuda_gemv" if 2 * m <= launch.GEMV_MAX_M else
                   "cuda_wgmma" if hopper and wgmma.MIN_M <= 2 * m <= wgmma.MAX_M else
                   "cuda_mma" if 2 * m <= mma.MAX_M else "cuda_dequant_cublas")
    assert chosen == want_kernel
    y = torch.ops.trit.linear_tiled(x, r.wq, r.sc, n, g, bias).float()
    want = ref_linear(x, packed, scale, g, bias).float()
    assert y.shape == (2, m, n)
    assert float((y - want).norm() / want.norm()) < 1e-2


# the kernel ahead of the one tested: it lets its dependents launch at once (griddepcontrol.launch_dependents),
# spins for ``spin`` clocks, and only then writes dst: a dependent that read dst before its wait would see the
# previous replay's values
_LATE_WRITER = r"""
extern "C" __global__ void trit_test_late_writer(const unsigned short* src, unsigned short* dst, int n,
                                                  long long spin) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
"""


def _late_write(src: torch.Tensor, dst: torch.Tensor, spin: int = 200_000) -> None:
    """``dst[:] = src`` after ``spin`` clocks, launched plainly (never itself a dependent) on the current stream."""
    import ctypes

    from trit.kernels.cuda import nvrtc

    kern = nvrtc.load(_LATE_WRITER, "trit_test_late_writer")
    args = [ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(dst.data_ptr()), ctypes.c_int(src.numel()),
            ctypes.c_longlong(spin)]
    params = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    assert nvrtc.driver().cuLaunchKernel(kern.func, 8, 1, 1, 128, 1, 1, 0, stream, params, None) == 0


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90")
@pytest.mark.parametrize(("run", "m"), [("run_gemv", 1), ("run_imma", 4), ("run_mma", 17), ("run_wgmma", 64),
                                        ("run_dequant", 300), ("triton_gemv", 3), ("triton_skinny", 16)])
def test_a_kernel_launched_with_pdl_waits_for_the_kernel_ahead(run: str, m: int, monkeypatch) -> None:
    """TRIT_PDL=1 in a CUDA graph behind a kernel that lets it launch early and writes x late: the plain
    launch's bytes on every replay, for the CUDA kernels of the mma layout and format v1's Triton GEMV and
    skinny kernel. (The dequantizer reads no x: for it this checks the launch path only.)"""
    from trit.kernels import pdl
    from trit.kernels.cuda import nvrtc

    if run == "run_wgmma" and launch._wgmma_support(torch.cuda.current_device()) is not None:
        pytest.skip("the wgmma kernel needs sm_90a")
    n, k, g = 4098, 576, 64
    packed = random_packed((n, k // 4), "cuda")
    scale = (torch.rand(n, fmt.num_groups(g, k), device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
    r = mma.repack(packed, scale, g, k)
    src = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    x = torch.empty_like(src)
    pdl_launches = []
    if run.startswith("triton_"):
        from trit.kernels.triton import device, gemv, skinny

        kernel = {"triton_gemv": gemv.gemv, "triton_skinny": skinny.skinny}[run]

        def fn(x, r, bias):
            return kernel(x, packed.view(torch.int32), scale, g, bias)

        plain_kwargs = device.pdl_kwargs

        def counted(x: torch.Tensor) -> dict:
            kw = plain_kwargs(x)
            if kw:
                pdl_launches.append(kw)
            return kw

        for module in (device, gemv, skinny):
            monkeypatch.setattr(module, "pdl_kwargs", counted)
    else:
        fn = getattr(launch, run)
        config = nvrtc.pdl_config
        monkeypatch.setattr(nvrtc, "pdl_config", lambda *a: pdl_launches.append(a) or config(*a))

    def step() -> torch.Tensor:
        _late_write(src, x)
        return fn(x, r, None)

    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(pdl.ENV, flag)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up: compiles and loads
        torch.cuda.current_stream().wait_stream(stream)
        before = len(pdl_launches)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = step()
        assert (len(pdl_launches) > before) == (flag == "1")  # captured with the attribute, or without
        got = []
        for i in range(3):
            gen = torch.Generator("cuda").manual_seed(i)
            src.copy_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=gen))
            graph.replay()
            got.append(y.clone())
        outs[flag] = got
    for plain, early in zip(outs["0"], outs["1"], strict=True):
        assert torch.equal(plain, early)
    assert not torch.equal(outs["1"][0], outs["1"][1])  # the replays did see new inputs
