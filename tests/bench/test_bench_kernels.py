"""``trit bench kernels`` without a GPU: its layer shapes, and the refusal of a model it has none for."""

from __future__ import annotations

from pathlib import Path

import pytest

from trit.bench import decode, kernels


@pytest.mark.parametrize("model", list(kernels.SHAPES))
def test_the_layer_shapes_are_the_models_of_the_other_benchmarks(model: str) -> None:
    """qkv, o, gate_up and down of each model as ``trit bench decode`` and ``serve`` build it."""
    c = decode.SHAPES[model]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    want = (("qkv", q + 2 * kv, c["hidden_size"]), ("o", c["hidden_size"], q),
            ("gate_up", 2 * c["intermediate_size"], c["hidden_size"]), ("down", c["hidden_size"], c["intermediate_size"]))
    assert kernels.SHAPES[model] == want


def test_an_unknown_model_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kernels.main(tmp_path / "out", models=("llama3-8b", "nope")) == 2
    err = capsys.readouterr().err
    assert "no layer shapes for nope" in err and "27b" in err
    assert not (tmp_path / "out").exists()  # nothing written
