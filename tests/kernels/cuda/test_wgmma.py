"""The wgmma kernel on the mma layout (``trit/kernels/cuda/wgmma.py``, ``wgmma.cu``).

On the CPU: the configs tuning and the heuristic produce are ones the kernel's
static asserts accept and whose shared memory fits; where NVRTC is installed,
every token width and group compiles for sm_90a. On an sm_90 GPU: the kernel
against the reference on odd shapes (the layout itself is checked against
format v1 in ``test_mma.py``).
"""

from __future__ import annotations

import json

import pytest
import torch
from cuda_helpers import check_layout_kernel, have_nvrtc, random_layer  # noqa: I001

from trit import format as fmt
from trit.kernels.cuda import mma, nvrtc, wgmma

SHAPES = [(34, 128, 64), (64, 576, 64), (33, 192, fmt.PER_ROW), (130, 256, 32), (50, 640, 128), (300, 1000, -1)]
LAYERS = [(28672, 4096), (4096, 14336), (6144, 4096), (64, 576), (1000, 1024)]


@pytest.mark.parametrize(("n", "k"), LAYERS)
@pytest.mark.parametrize("m", [1, 16, 17, 64, 65, 128, 200, 256])
def test_every_config_it_may_run_is_valid_and_fits(n: int, k: int, m: int) -> None:
    r = mma.repack(*random_layer(n, k, 64), 64, k) if n * k <= 2**20 else mma.shape_only(n, k, 64)
    cands = wgmma.configs_for(m, r, 132)
    assert cands, (m, n, k)
    for cfg in [*cands, wgmma.heuristic(m, r, 132), wgmma.heuristic(m, r, 78)]:
        assert wgmma.valid(cfg), cfg
        assert wgmma.smem_bytes(cfg, 64) <= wgmma.SMEM_LIMIT, cfg
        assert cfg.ntok * cfg.rt <= 256 and cfg.stages >= 3
    assert len(set(cands)) == len(cands)


def _swizzle128(addr: torch.Tensor) -> torch.Tensor:
    """The 128-byte swizzle of a shared-memory address (PTX: bits 4-6 XOR bits 7-9, atoms 1024-byte aligned)."""
    return addr ^ (((addr >> 7) & 7) << 4)


@pytest.mark.parametrize("cfg", [wgmma.WgmmaConfig(ntok, rt, ki, 1, 3, warps, ws=ws) for ntok in wgmma.TOKENS
                                 for rt, ki, warps, ws in ((1, 1, 4, 0), (1, 1, 8, 0), (1, 2, 8, 0), (1, 1, 8, 1),
                                                           (1, 2, 4, 1), (1, 4, 4, 1))])
def test_the_x_copy_lands_where_the_descriptors_read(cfg: wgmma.WgmmaConfig) -> None:
    """Each k16 step's descriptor (atom kk / 64, plus 32 bytes a step inside it; 8-token groups 1024 bytes apart)
    names, through the 128-byte swizzle, the bytes the kernel's copy wrote each (token, input) to."""
    if not wgmma.valid(cfg):
        pytest.skip("not a config the kernel takes")
    off = wgmma.x_stage_offsets(cfg)
    kc_total = cfg.ki * mma.K_STEP
    assert off.min() >= 0 and off.unique().numel() == off.numel()  # every element once, none twice
    assert int(off.max()) < cfg.ntok * kc_total * 2
    n = torch.arange(cfg.ntok).view(-1, 1)
    for kk in range(0, kc_total, 16):
        start = (kk // 64) * cfg.ntok * 128 + (kk % 64) * 2  # the descriptor's start address, as wgmma.cu sets it
        k = torch.arange(16).view(1, -1)
        logical = start + (n // 8) * 1024 + (n % 8) * 128 + 2 * k  # K-major, SBO 1024, within the atom's row
        assert torch.equal(_swizzle128(logical), off[:, kk: kk + 16]), kk


def test_invalid_configs_are_refused() -> None:
    assert not wgmma.valid(wgmma.WgmmaConfig(ntok=48))  # not a width it is built for
    assert not wgmma.valid(wgmma.WgmmaConfig(stages=2))  # a stage is refilled two chunks after it was read
    assert not wgmma.valid(wgmma.WgmmaConfig(ntok=256, rt=2))  # 256 accumulators a thread
    assert not wgmma.valid(wgmma.WgmmaConfig(ki=2, warps=4))  # a copy pass would hold half an 8-token group
    assert not wgmma.valid(wgmma.WgmmaConfig(ntok=16, warps=4, ki=2))
    assert not wgmma.valid(wgmma.WgmmaConfig(bufs=3))  # the buffers cycle over a chunk's 8 k16 steps
    x = torch.zeros(4, 576, dtype=torch.bfloat16)
    r = mma.repack(*random_layer(64, 576, 64), 64, 576)
    with pytest.raises(ValueError, match="not a wgmma config"):
        wgmma.linear(x, r, wgmma.WgmmaConfig(stages=2))
    with pytest.raises(ValueError, match="bf16 x with K = 576"):
        wgmma.linear(x.float(), r)


def test_it_refuses_a_device_other_than_sm_90() -> None:
    assert "CUDA, not cpu" in wgmma.supported(torch.device("cpu"))


@pytest.mark.skipif(not have_nvrtc(), reason="NVRTC is not installed here (CUDA builds of torch bring it)")
def test_every_width_group_and_copy_shape_compiles_for_sm_90a() -> None:
    cfgs = [(wgmma.WgmmaConfig(ntok, 2 if ntok <= 128 else 1, 1, 1, 3, 8), g)
            for ntok in wgmma.TOKENS for g in (32, 64, 128, fmt.PER_ROW)]
    cfgs += [(wgmma.WgmmaConfig(ntok, 1, ki, 1, 4, warps), 32) for ntok in (64, 256) for ki, warps in ((2, 8), (1, 4))]
    cfgs += [(wgmma.WgmmaConfig(ntok, 2 if ntok <= 128 else 1, 1, 1, 3, 8, bufs=4), 64) for ntok in wgmma.TOKENS]
    cfgs += [(wgmma.WgmmaConfig(ntok, 2 if ntok <= 128 else 1, ki, 1, 3, warps, bufs=4, ws=1), g)
             for ntok in wgmma.TOKENS for ki, warps, g in ((1, 8, 64), (2, 4, fmt.PER_ROW)) if ki == 1 or ntok <= 128]
    for cfg, g in cfgs:
        assert wgmma.valid(cfg), cfg
        cubin, lowered, log = nvrtc.compile_cubin(wgmma.source(), wgmma.kernel_name(cfg, g), "sm_90a")
        prefix = "_Z13trit_wgmma_ws" if cfg.ws else "_Z10trit_wgmma"
        assert len(cubin) > 1000 and lowered.startswith(prefix), log


def test_the_heuristic_splits_k_where_tuning_did() -> None:
    """Untuned shapes run the heuristic; K splits cost most where they are wrong (a reduction over M x N), so it
    splits where the shipped tables' tuning mostly did: few blocks, M <= 64, K longer than N."""
    from trit.kernels import tuning

    agree = {True: 0, False: 0}
    for path in sorted(tuning.SHIPPED.glob("*.json")):
        for key, tuned in json.loads(path.read_text())["configs"].get("cuda_wgmma", {}).items():
            m, n, k, g, _ = key.split(",")
            cfg = wgmma.heuristic(int(m), mma.shape_only(int(n), int(k), int(g)), 132)
            agree[(cfg.splits > 1) == (tuned["splits"] > 1)] += 1
    assert agree[True] >= 8 * agree[False] and agree[True] >= 60, agree


def test_the_shipped_configs_are_valid_and_fit() -> None:
    from trit.kernels import tuning

    tables = {path.name: json.loads(path.read_text())["configs"].get("cuda_wgmma", {})
              for path in sorted(tuning.SHIPPED.glob("*.json"))}
    assert tables.get("h200.json") and tables.get("h100.json")  # Hopper tables hold wgmma configs
    for name, table in tables.items():
        for key, entry in table.items():
            cfg, g = wgmma.WgmmaConfig(**entry), int(key.split(",")[3])
            assert wgmma.valid(cfg) and wgmma.smem_bytes(cfg, g) <= wgmma.SMEM_LIMIT, (name, key)


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == wgmma.ARCH


CONFIGS = (None, wgmma.WgmmaConfig(16, 2, 1, 2, 4, 8), wgmma.WgmmaConfig(64, 1, 1, 1, 3, 4),
           wgmma.WgmmaConfig(128, 2, 1, 3, 5, 8), wgmma.WgmmaConfig(256, 1, 1, 1, 3, 4),
           wgmma.WgmmaConfig(128, 1, 2, 2, 3, 8), wgmma.WgmmaConfig(16, 2, 1, 2, 4, 8, bufs=4),
           wgmma.WgmmaConfig(64, 2, 2, 1, 3, 8, bufs=4), wgmma.WgmmaConfig(128, 2, 1, 1, 4, 8, bufs=4, ws=1),
           wgmma.WgmmaConfig(16, 1, 2, 3, 5, 4, ws=1), wgmma.WgmmaConfig(64, 1, 1, 2, 3, 8, bufs=4, ws=1),
           wgmma.WgmmaConfig(256, 1, 1, 1, 3, 4, ws=1), wgmma.WgmmaConfig(32, 2, 4, 1, 3, 8, ws=1))


@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("m", [1, 3, 17, 64, 100, 128, 300])
@pytest.mark.parametrize(("n", "k", "g"), SHAPES)
def test_the_kernel_matches_the_reference(m: int, n: int, k: int, g: int) -> None:
    check_layout_kernel(wgmma.linear, CONFIGS, m, n, k, g)


def test_an_nvrtc_without_sm_90a_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(nvrtc, "version", lambda: (11, 8))
    assert "NVRTC 11.8 has no sm_90a target" in wgmma.supported(torch.device("cuda", 0))
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 4))
    assert wgmma.supported(torch.device("cuda", 0)) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "this GPU is sm_80" in wgmma.supported(torch.device("cuda", 0))
