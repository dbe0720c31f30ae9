"""The audit passes a good checkpoint and names each kind of corruption."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import corrupt_config, rewrite_tensors

from trit.eval.audit import audit

LAYER = "model.layers.1.self_attn.o_proj"


@pytest.fixture
def ckpt(tiny_llama_trit: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_llama_trit, tmp_path / "c"))


def test_passes_a_good_checkpoint(ckpt: Path) -> None:
    report = audit(ckpt)
    assert report.ok, report.table()
    assert report.bits_per_weight == pytest.approx(2.5)  # group 32: 2 + 16/32
    assert report.table().endswith("PASS")
    assert all(c.checked > 0 for c in report.checks)


def _scale_nan(t: dict) -> None:
    t[f"{LAYER}.weight_scale"][0, 0] = float("nan")


def _swap_to_float(t: dict) -> None:
    packed = t.pop(f"{LAYER}.weight_packed")
    t.pop(f"{LAYER}.weight_scale")
    t[f"{LAYER}.weight"] = torch.zeros(packed.shape[0], packed.shape[1] * 4, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("edit", "check", "match"),
    [
        (lambda t: t[f"{LAYER}.weight_packed"].view(-1)[0:1].fill_(0b11), "codes in {0,1,2}", "1 codes equal to 3"),
        (_scale_nan, "scales finite, positive, dtype", "1 NaN or Inf"),
        (lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"].bfloat16()),
         "scales finite, positive, dtype", "expected dtype float16 (the config's scale_dtype)"),
        (lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"][:-1].clone()),
         "layer layout (dtype, shape)", "expected shape (64, 2)"),
        (lambda t: t.pop(f"{LAYER}.weight_packed"), "tensors present and known", "expected a tensor in the checkpoint"),
        (_swap_to_float, "ternary vs modules_not_converted", "expected ternary"),
        (lambda t: t["model.norm.weight"].fill_(float("inf")), "float tensors finite", "64 NaN or Inf"),
    ],
)
def test_names_each_corruption(ckpt: Path, edit, check: str, match: str) -> None:
    rewrite_tensors(ckpt, edit)
    report = audit(ckpt)
    assert not report.ok
    failed = {c.name: c for c in report.checks if not c.ok}
    assert check in failed, report.table()
    assert any(match in f for f in failed[check].failures), failed[check].failures
    assert report.table().endswith("FAIL")


def test_format_version_2(ckpt: Path) -> None:
    corrupt_config(ckpt, format_version=2)
    report = audit(ckpt)
    assert not report.ok and "format_version: expected 1" in report.table()


def test_padding_must_be_zero(tmp_path: Path) -> None:
    from conftest import make_tiny_model

    from trit.configs import AbsmeanConfig
    from trit.convert import convert
    from trit.format import pack

    src = make_tiny_model(tmp_path / "f", hidden=96, intermediate=128)
    out = tmp_path / "t"
    convert(src, out, AbsmeanConfig(64), progress=False)
    layer = "model.layers.0.mlp.gate_proj"  # K = 96, padded to 128

    def spoil(t: dict) -> None:
        values = torch.ones(128, 128, dtype=torch.int8)
        t[f"{layer}.weight_packed"][:, 24:] = pack(values)[:, 24:]

    rewrite_tensors(out, spoil)
    report = audit(out)
    failed = {c.name: c for c in report.checks if not c.ok}
    assert "zero weights (code 1) past K=96" in failed["padding is zero"].failures[0]
