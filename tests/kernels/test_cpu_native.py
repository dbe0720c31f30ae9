"""The native CPU kernel (C++, built at first use) against the reference, on odd shapes; and its fallback."""

from __future__ import annotations

import pytest
import torch
from conftest import seeded_layer

from trit.kernels import cpu_native, reference, registry


@pytest.fixture(scope="module")
def native():
    if cpu_native.module() is None:
        pytest.fail(f"the native CPU kernel did not build on this machine: {cpu_native.build_error()}")
    return cpu_native


def rel_err(y: torch.Tensor, want: torch.Tensor) -> float:
    return float((y.double() - want.double()).norm() / want.double().norm())


# (N, K, group, M): N not a multiple of the 16-row blocks, K = 576 (SmolLM2) and K padded to a whole group,
# groups 32/64/128 and one scale a row, M = 1 to 16 (tiles of 8, 4, 2 and 1 tokens)
CASES = [(40, 576, 64, 1), (33, 576, 32, 3), (17, 128, -1, 5), (48, 576, 128, 9), (40, 1536, 64, 16),
         (7, 4096, 128, 2), (64, 576, -1, 1)]


@pytest.mark.parametrize(("n", "k", "group", "m"), CASES)
def test_matches_the_reference(native, n: int, k: int, group: int, m: int) -> None:
    packed, scale = seeded_layer(n, k, group, seed=n + k)
    x, bias = torch.randn(m, k) * 3, torch.randn(n)
    assert native.refuse(packed.shape[1] * 4, group, torch.float32) is None and native.rule(m) is None
    # int16 activations: the rounding error is about 2**-16 of the largest value of each token's 64-input chunk
    assert rel_err(native.linear(x, packed, scale, group, bias), reference.linear(x, packed, scale, group, bias)) < 1e-4
    # int8 activations by BitNet's rule: the reference's own arithmetic, up to float summation order
    torch.testing.assert_close(native.linear_a8(x, packed, scale, group, bias),
                               reference.linear_a8(x, packed, scale, group, bias), rtol=1e-5, atol=1e-4)


def test_an_outlier_channel_costs_precision_in_its_own_chunk_only(native) -> None:
    """Activations like SmolLM2's: a few channels thousands of times larger than the rest. One int16 scale a token
    would round the small ones to a few levels; one a 64-input chunk keeps the error near 2**-16 of the output."""
    packed, scale = seeded_layer(32, 576, 64, seed=7)
    x = torch.randn(4, 576) * 0.05
    x[:, 17] = 2000.0
    x[:, 300] = -900.0
    err = rel_err(native.linear(x, packed, scale, 64), reference.linear(x, packed, scale, 64))
    assert err < 1e-4


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_bf16_and_fp32_scales_and_bf16_activations(native, scale_dtype: torch.dtype) -> None:
    packed, scale = seeded_layer(24, 576, 64, seed=3)
    scale = scale.to(scale_dtype)
    x = torch.randn(2, 3, 576).bfloat16()  # leading dims kept, bf16 in and out
    y = native.linear(x, packed, scale, 64)
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16
    assert rel_err(y.float(), reference.linear(x.float(), packed, scale, 64)) < 1e-2  # bf16 output rounding


def test_zero_and_tiny_rows(native) -> None:
    packed, scale = seeded_layer(16, 128, 64, seed=1)
    x = torch.zeros(2, 128)
    x[1, 5] = 1e-30
    y = native.linear(x, packed, scale, 64, torch.ones(16))
    assert torch.equal(y[0], torch.ones(16)) and torch.isfinite(y).all()


def test_the_op_falls_back_when_the_build_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_native, "_STATE", {})
    monkeypatch.setattr(cpu_native, "_build", lambda: (_ for _ in ()).throw(OSError("no g++ here")))
    problem = registry.Problem(1, 64, 576, 64, "cpu", torch.float32)
    choice = registry._choose(problem, frozenset())  # not the cached choice
    assert choice.kernel is registry.CPU
    assert ("cpu_native", "cannot: not built: OSError: no g++ here") in choice.refused


def _age(path, seconds: float) -> None:
    import os
    import time

    os.utime(path, (time.time() - seconds, time.time() - seconds))


def test_a_build_killed_halfway_does_not_stop_the_next(native) -> None:
    """torch's lock file, left in the build folder by a builder that was killed, is removed by the next build
    (which would otherwise wait on it forever) and the extension loads."""
    stale = cpu_native.build_dir() / "lock"
    stale.touch()
    _age(stale, cpu_native.STALE_LOCK_S + 60)
    mod = cpu_native._build()
    assert not stale.exists() and mod.isa() != "none"


def test_a_young_torch_lock_is_waited_for_not_removed(tmp_path) -> None:
    """A lock file younger than the stale age may be a live build (a killed builder's compiler finishing, or
    another machine sharing the cache): the build waits for it to go, and past the timeout gives up, leaving it."""
    import threading
    import time

    young = tmp_path / "lock"
    young.touch()
    threading.Timer(0.5, young.unlink).start()  # the other builder finishes
    t0 = time.monotonic()
    with cpu_native._build_lock(tmp_path, timeout=10, stale_after=60):
        assert time.monotonic() - t0 >= 0.45
    young.touch()
    with pytest.raises(TimeoutError, match="has been held for over"):
        with cpu_native._build_lock(tmp_path, timeout=0.5, stale_after=60):
            pass
    assert young.exists()
    _age(young, 120)  # old enough: a leftover, removed at once
    with cpu_native._build_lock(tmp_path, timeout=0.5, stale_after=60):
        assert not young.exists()


def test_a_second_builder_waits_then_gives_up(tmp_path) -> None:
    """While another builder holds the folder (an OS lock, released when its process dies), a build waits for
    it; past the timeout it raises, which the op turns into the fallback, instead of hanging."""
    import fcntl
    import time

    with open(tmp_path / "trit-build.lock", "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another open file: flock sees a second holder even in this process
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="another process has been building"):
            with cpu_native._build_lock(tmp_path, timeout=0.5):
                pass
        assert time.monotonic() - t0 >= 0.5
    with cpu_native._build_lock(tmp_path, timeout=0.5):  # released: taken at once
        assert (tmp_path / "trit-build.lock").exists()


def test_a_file_system_without_locks_builds_without_one(tmp_path, monkeypatch, caplog) -> None:
    """Where flock is refused (an NFS mount without lockd: ENOLCK), the build goes on as torch's alone would,
    says so, and leaves torch's lock file to torch."""
    import errno
    import fcntl
    import logging

    def refuse(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    (tmp_path / "lock").touch()
    _age(tmp_path / "lock", 3600)
    with caplog.at_level(logging.WARNING, logger="trit.kernels.cpu_native"):
        with cpu_native._build_lock(tmp_path, timeout=0.5):
            pass
    assert "building without it" in caplog.text and (tmp_path / "lock").exists()
