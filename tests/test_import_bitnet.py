"""BitNet import: checkpoints written as transformers writes them, compared with transformers' own BitNet classes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import rewrite_tensors

from trit import format as fmt
from trit import runtime
from trit.cli import main
from trit.import_bitnet import import_bitnet, unpack_output_dim
from trit.synthetic import make_bitnet_checkpoint

VARIANTS = [  # (model_type, linear_class, quantization_mode)
    ("bitnet", "bitlinear", "offline"),  # transformers' default class: the scale is stored inverted
    ("bitnet", "autobitlinear", "offline"),  # BitNet b1.58 2B4T's config: the scale multiplies
    ("bitnet", "autobitlinear", "online"),  # the bf16 "master" weights, quantized at import
    ("llama", "bitlinear", "offline"),  # Falcon3-1.58bit / Llama3-8B-1.58: Llama with BitLinear layers
]


@pytest.fixture(autouse=True)
def _eager_transformers():
    """transformers' BitLinear wraps its helpers in torch.compile; run them eagerly (no C++ compiler needed)."""
    with torch._dynamo.config.patch(disable=True):
        yield


def _hf_model(src: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype).eval()


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize(("model_type", "linear_class", "mode"), VARIANTS)
def test_import_matches_transformers(tmp_path: Path, model_type: str, linear_class: str, mode: str) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src", linear_class, mode, model_type=model_type)
    import_bitnet(src, tmp_path / "trit", progress=False, log=lambda s: None)
    ref32, ref16 = _hf_model(src, torch.float32), _hf_model(src, torch.bfloat16)
    ours = runtime.load(tmp_path / "trit", device="cpu", dtype=torch.float32)
    assert type(ours.model).__name__ == type(ref32).__name__
    ids = torch.randint(3, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, bf16, got = ref32(ids).logits, ref16(ids).logits, ours.model(ids).logits
    # "within bf16 tolerance", measured: no farther from transformers in fp32 than transformers in bf16 is.
    # Both sides quantize activations to int8; a value on a rounding boundary may round apart, so not bitwise.
    assert _rel_err(got, want) <= _rel_err(bf16, want)
    assert _rel_err(got, want) < 2**-6
    for prompt in ids:
        p = prompt[None, :12]
        with torch.no_grad():
            hf_greedy = ref32.generate(p, max_new_tokens=12, do_sample=False, pad_token_id=2)[:, 12:]
        assert runtime.greedy_ids(ours, p, 12).tolist() == hf_greedy.tolist()


def test_imported_config_records_the_arithmetic(tmp_path: Path) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src", "autobitlinear", "offline")
    report = import_bitnet(src, tmp_path / "trit", progress=False, log=lambda s: None)
    q = json.loads((tmp_path / "trit" / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "trit" and q["group_size"] == -1
    assert q["activation"] == "int8_per_token"
    assert q["scale_dtype"] == "bfloat16"  # the source's bf16 scales, carried exactly
    assert q["source"] == {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "offline"}
    assert sum(r.action == "ternary" for r in report.layers) == 14
    inverse = make_bitnet_checkpoint(tmp_path / "src2", "bitlinear", "offline")
    import_bitnet(inverse, tmp_path / "trit2", progress=False, log=lambda s: None)
    q2 = json.loads((tmp_path / "trit2" / "config.json").read_text())["quantization_config"]
    assert q2["scale_dtype"] == "float32"  # 1 / weight_scale has no exact 16-bit form


def test_unpack_output_dim_inverts_transformers_packing() -> None:
    from transformers.integrations.bitnet import pack_weights

    for n in (8, 12, 4):
        values = torch.randint(-1, 2, (n, 20), generator=torch.Generator().manual_seed(n), dtype=torch.int8)
        codes = unpack_output_dim(pack_weights(values.clone()), n)
        assert torch.equal(codes.to(torch.int8) - 1, values)


def test_audit_passes_on_an_imported_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    import_bitnet(src, tmp_path / "trit", progress=False, log=lambda s: None)
    assert main(["audit", str(tmp_path / "trit")]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_cli_import(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    assert main(["import", str(src), str(tmp_path / "trit"), "--quiet"]) == 0
    assert "ternary layers: 14" in capsys.readouterr().out
    assert fmt.TritConfig.from_dict(json.loads((tmp_path / "trit" / "config.json").read_text())["quantization_config"])


def _fails_leaving_nothing(src: Path, out: Path, capsys: pytest.CaptureFixture, message: str) -> None:
    before = {p: p.stat().st_mtime_ns for p in src.iterdir()}
    assert main(["import", str(src), str(out), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]  # no partial folder
    assert {p: p.stat().st_mtime_ns for p in src.iterdir()} == before  # the source untouched


def test_a_code_of_3_fails_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    rewrite_tensors(src, lambda t: t["model.layers.1.mlp.up_proj.weight"][0, :3].fill_(0b11))
    _fails_leaving_nothing(
        src, tmp_path / "out", capsys,
        "model.layers.1.mlp.up_proj.weight: expected codes in {0, 1, 2} (ternary), found 3 codes of value 3",
    )


def test_a_missing_scale_fails_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    rewrite_tensors(src, lambda t: t.pop("model.layers.0.self_attn.o_proj.weight_scale"))
    _fails_leaving_nothing(
        src, tmp_path / "out", capsys,
        "model.layers.0.self_attn.o_proj.weight_scale: expected a one-element BitNet weight scale, found no such tensor",
    )


def test_a_zero_scale_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    rewrite_tensors(src, lambda t: t["model.layers.0.mlp.down_proj.weight_scale"].zero_())
    _fails_leaving_nothing(src, tmp_path / "out", capsys, "down_proj.weight_scale: expected a finite positive scale")


def test_a_float_checkpoint_that_is_not_ternary_is_refused(tiny_llama: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """With no quantization_config, ``trit import`` reads a float checkpoint as TriLM's (tests/test_import_trilm.py)
    and points a model that is not ternary at ``trit quantize``."""
    _fails_leaving_nothing(tiny_llama, tmp_path / "out", capsys, "quantize it with trit quantize instead")


def test_another_quantization_method_is_refused(tiny_llama: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    cfg = json.loads((tiny_llama / "config.json").read_text())
    (tiny_llama / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "gptq"}}))
    _fails_leaving_nothing(tiny_llama, tmp_path / "out", capsys,
                           "expected quantization_config.quant_method 'bitnet', found 'gptq'")


def test_quantize_points_a_bitnet_checkpoint_to_import(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    assert main(["quantize", str(src), str(tmp_path / "out"), "--quiet"]) == 2
    assert "import it with `trit import`" in capsys.readouterr().err


def test_rms_norm_inside_bitlinear_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["use_rms_norm"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    _fails_leaving_nothing(src, tmp_path / "out", capsys, "use_rms_norm = true")


def test_existing_output_is_kept_on_failure(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = make_bitnet_checkpoint(tmp_path / "src")
    import_bitnet(src, tmp_path / "trit", progress=False, log=lambda s: None)
    good = {p.name: p.read_bytes() for p in (tmp_path / "trit").iterdir()}
    bad = Path(shutil.copytree(src, tmp_path / "bad"))
    rewrite_tensors(bad, lambda t: t["model.layers.0.mlp.gate_proj.weight"].fill_(0xFF))
    assert main(["import", str(bad), str(tmp_path / "trit"), "--overwrite", "--quiet"]) == 2
    assert {p.name: p.read_bytes() for p in (tmp_path / "trit").iterdir()} == good
