"""``trit bench kernels`` without a GPU: its layer shapes, and the refusal of a model it has none for."""

from __future__ import annotations

from pathlib import Path

import pytest

from trit.bench import kernels


def test_the_layer_shapes_are_the_models_of_the_other_benchmarks() -> None:
    """qkv, o, gate_up and down of each model as ``trit bench decode`` and ``serve`` build it (their configs)."""
    assert kernels.SHAPES == {
        "llama3-8b": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)),
        "qwen2-1.5b": (("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960)),
        "27b": (("qkv", 8192, 5376), ("o", 5376, 4096), ("gate_up", 43008, 5376), ("down", 5376, 21504)),
    }


def test_an_unknown_model_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kernels.main(tmp_path / "out", models=("llama3-8b", "nope")) == 2
    err = capsys.readouterr().err
    assert "no layer shapes for nope" in err and "27b" in err
    assert not (tmp_path / "out").exists()  # nothing written
