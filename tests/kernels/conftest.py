"""Kernel tests share one process's kernel choices: each test's patched tables or kernel switches must not leave
choices behind for the next."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_kernel_choices():
    """Set up before a test's monkeypatch, so it runs after monkeypatch has put the tables back: the choices the
    test cached (``registry._choose``, keyed by the tables' generation) are made stale."""
    yield
    from trit.kernels import tuning

    with tuning._LOCK:
        tuning._bump()
