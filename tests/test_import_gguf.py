"""``trit import FILE.gguf``: every ternary GGUF format into trit's, exactly; bad files refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import exact_logits, make_tiny_model, trit
from gguf_files import block_codes, by_format, by_gguf_quantizer, write_gguf

from trit import format as fmt
from trit import ggml
from trit.checkpoint import open_checkpoint
from trit.import_gguf import import_gguf

SIZES = {"hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2}  # K a multiple of 256 everywhere


@pytest.fixture(scope="module")
def float_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("gguf-src") / "llama", **SIZES)


def _state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _dense(ckpt: Path) -> dict[str, torch.Tensor]:
    """Each ternary layer of a trit checkpoint as float32 (N, K)."""
    state, qcfg = _state(ckpt), open_checkpoint(ckpt).trit_config()
    out = {}
    for layer in fmt.layer_names(state):
        values = fmt.unpack(state[f"{layer}.{fmt.PACKED_SUFFIX}"]).float()
        s = state[f"{layer}.{fmt.SCALE_SUFFIX}"].float()
        width = values.shape[1] if qcfg.group_size == fmt.PER_ROW else qcfg.group_size
        out[layer] = values * s.repeat_interleave(width, 1)[:, : values.shape[1]]
    return out


def _expected(src: Path, block: int, per_tensor: bool = False) -> dict[str, torch.Tensor]:
    """The source's decoder linears rounded as tests/gguf_files.py rounds them, in Hugging Face row order."""
    out = {}
    for name, w in _state(src).items():
        if name.endswith("proj.weight"):
            codes, s = block_codes(w.float(), w.shape[1] if per_tensor else block)
            if per_tensor:
                s = torch.full(s.shape, float(w.float().abs().amax()))
            out[name.removesuffix(".weight")] = (codes.float() - 1) * s.float().repeat_interleave(
                w.shape[1] if per_tensor else block, 1)
    return out


FORMATS = [(ggml.Q2_0, 64), (ggml.PQ2_0, 128), (ggml.Q2_0_G128, 128), (ggml.TQ2_0, 256), (ggml.TQ1_0, 256),
           (ggml.PTQ1_0, 128), (ggml.I2_S, fmt.PER_ROW)]


@pytest.mark.parametrize(("f", "group"), FORMATS, ids=[f.name.split()[0] + ("_G128" if f is ggml.Q2_0_G128 else "")
                                                      for f, _ in FORMATS])
def test_each_format_imports_its_codes_and_scales(float_llama: Path, tmp_path: Path, f: ggml.BlockFormat,
                                                  group: int) -> None:
    path = write_gguf(float_llama, tmp_path / "m.gguf", "llama", by_format(f))
    report = import_gguf(path, tmp_path / "out", progress=False, log=lambda _: None)
    qcfg = open_checkpoint(tmp_path / "out").trit_config()
    assert qcfg.group_size == group
    assert qcfg.activation is fmt.ActivationQuant.NONE
    want = _expected(float_llama, f.block, per_tensor=f is ggml.I2_S)
    got = _dense(tmp_path / "out")
    assert got.keys() == want.keys() and len(report.layers) == len(want)
    for layer in want:
        torch.testing.assert_close(got[layer], want[layer], rtol=0, atol=0, msg=layer)


@pytest.mark.parametrize("qtype", ["TQ1_0", "TQ2_0"])
def test_the_gguf_packages_quantizer_imports_to_its_dequantized_values(float_llama: Path, tmp_path: Path,
                                                                       qtype: str) -> None:
    from gguf import GGMLQuantizationType, quants

    path = write_gguf(float_llama, tmp_path / "m.gguf", "llama", by_gguf_quantizer(qtype))
    import_gguf(path, tmp_path / "out", progress=False, log=lambda _: None)
    got = _dense(tmp_path / "out")
    q = GGMLQuantizationType[qtype]
    for name, w in _state(float_llama).items():
        if name.endswith("proj.weight"):  # the quantizer works row by row: Q/K row order does not change it
            want = quants.dequantize(quants.quantize(w.float().numpy(), q), q)
            assert np.array_equal(got[name.removesuffix(".weight")].numpy(), want), name


def test_imported_llama_runs_as_its_float_twin(float_llama: Path, tmp_path: Path) -> None:
    """The runtime on the import computes what the float model computes with the GGUF's weights in place: checks
    Q/K row order, norms, embeddings and config together."""
    from transformers import AutoModelForCausalLM


    path = write_gguf(float_llama, tmp_path / "m.gguf", "llama", by_format(ggml.TQ2_0))
    import_gguf(path, tmp_path / "out", progress=False, log=lambda _: None)
    twin = AutoModelForCausalLM.from_pretrained(float_llama, dtype=torch.float32)
    with torch.no_grad():
        for layer, w in _expected(float_llama, 256).items():
            twin.get_submodule(layer).weight.copy_(w)
    ids = torch.tensor([[1, 5, 9, 14, 3, 22, 7, 30]])
    torch.testing.assert_close(exact_logits(tmp_path / "out", ids), twin(ids).logits, rtol=1e-4, atol=1e-4)


def test_bitnet_cpp_file_imports_as_bitnet_with_int8_activations(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "bitnet", model_type="bitnet", **SIZES)
    path = write_gguf(src, tmp_path / "m.gguf", "bitnet-25", by_format(ggml.I2_S))
    import_gguf(path, tmp_path / "out", progress=False, log=lambda _: None)
    ckpt = open_checkpoint(tmp_path / "out")
    assert ckpt.config["model_type"] == "bitnet" and ckpt.config["hidden_act"] == "relu2"
    assert ckpt.trit_config().activation is fmt.ActivationQuant.INT8_PER_TOKEN
    got = _dense(tmp_path / "out")
    for layer, want in _expected(src, 0, per_tensor=True).items():
        assert torch.equal(got[layer], want), layer
    result = trit("generate", tmp_path / "out", "ab", "--max-new-tokens", "3", "--device", "cpu")
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------- bad files


def _code_3(name: str, t: torch.Tensor) -> tuple[np.ndarray, int]:
    codes, s = block_codes(t, 64)
    if name == "model.layers.1.mlp.up_proj.weight":
        codes[2, 70] = 3
    return ggml.encode(ggml.Q2_0, codes, s).numpy(), ggml.Q2_0.type_id


def _odd_blocks(name: str, t: torch.Tensor) -> tuple[np.ndarray, int]:
    raw, type_id = by_format(ggml.Q2_0)(name, t)
    if name == "model.layers.0.self_attn.v_proj.weight":  # 20 bytes a 64-block: no type has that
        return np.pad(raw.reshape(-1, 18), ((0, 0), (0, 2))).reshape(-1), type_id
    return raw, type_id


def _tl2(name: str, t: torch.Tensor) -> tuple[np.ndarray, int]:
    raw, _ = by_format(ggml.I2_S)(name, t)
    return raw, 39  # bitnet.cpp's TL2 id, mainline's MXFP4


BAD = {
    "code 3": ("llama", _code_3, "blk.1.ffn_up.weight.*codes equal to 3"),
    "no type's block": ("llama", _odd_blocks, "blk.0.attn_v.weight.*a block size no type has"),
    "fork id": ("bitnet-25", _tl2, "blk.0.*bitnet.cpp's TL2 \\(its fork's type id 39\\)"),
    "architecture": ("gemma3", by_format(ggml.Q2_0), "general.architecture 'gemma3': trit imports llama"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_file_refused_by_name_nothing_written(float_llama: Path, tmp_path: Path, case: str) -> None:
    arch, ternary, message = BAD[case]
    path = write_gguf(float_llama, tmp_path / "m.gguf", arch, ternary)
    result = trit("import", path, tmp_path / "out", "--quiet", check=False)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_truncated_file_refused_by_name(float_llama: Path, tmp_path: Path) -> None:
    path = write_gguf(float_llama, tmp_path / "m.gguf", "llama", by_format(ggml.TQ2_0))
    from trit.gguf_file import read_gguf

    last = max(read_gguf(path).tensors.values(), key=lambda i: i.offset)
    with open(path, "r+b") as f:
        f.truncate(last.offset + 10)
    result = trit("import", path, tmp_path / "out", "--quiet", check=False)
    assert result.returncode == 2
    assert last.name in result.stderr and "truncated" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_file_refused(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGML" + bytes(60))
    result = trit("import", tmp_path / "m.gguf", tmp_path / "out", check=False)
    assert result.returncode == 2 and "expected a GGUF file" in result.stderr, result.stderr
