"""``trit import`` of a float checkpoint whose linear weights are already {0, +-s} (TriLM's unpacked releases)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import exact_logits, make_tiny_model, trit

from trit import format as fmt
from trit.checkpoint import open_checkpoint


def _ternarize(folder: Path, shards_along_k: bool) -> None:
    """Every decoder linear to {0, +-s}: s one a row, or (``shards_along_k``) one per half of K for the layers a
    row-parallel shard splits (o_proj, down_proj), as a model trained on two shards stores them."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(str(path))
    for name, w in state.items():
        if not name.endswith("proj.weight"):
            continue
        n, k = w.shape
        halves = 2 if shards_along_k and name.endswith(("o_proj.weight", "down_proj.weight")) else 1
        s = torch.rand(n, halves, generator=torch.Generator().manual_seed(n + k)) * 0.1 + 0.01
        values = torch.randint(-1, 2, (n, k), generator=torch.Generator().manual_seed(k))
        state[name] = (values * s.repeat_interleave(k // halves, 1)).to(w.dtype)
    save_file(state, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize(("shards_along_k", "group"), [(False, fmt.PER_ROW), (True, 32)])
def test_ternary_float_imports_exactly(tmp_path: Path, shards_along_k: bool, group: int) -> None:
    from transformers import AutoModelForCausalLM


    src = make_tiny_model(tmp_path / "trilm")  # hidden 64: o_proj's halves are 32 wide
    _ternarize(src, shards_along_k)
    result = trit("import", src, tmp_path / "out", "--quiet")
    assert "ternary" in result.stdout
    qcfg = open_checkpoint(tmp_path / "out").trit_config()
    assert qcfg.group_size == group and qcfg.scale_dtype is fmt.ScaleDtype.BFLOAT16
    ids = torch.tensor([[1, 5, 9, 14, 3, 22, 7, 30]])
    want = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)(ids).logits
    torch.testing.assert_close(exact_logits(tmp_path / "out", ids), want, rtol=1e-5, atol=1e-5)


def test_a_float_model_that_is_not_ternary_is_refused(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "float")
    result = trit("import", src, tmp_path / "out", check=False)
    assert result.returncode == 2
    assert "model.layers.0.mlp.down_proj.weight" in result.stderr and "trit quantize" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
