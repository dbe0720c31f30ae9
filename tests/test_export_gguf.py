"""``trit export CKPT OUT.gguf``: checked by llama.cpp itself (llama-cpp-python), and by importing it back."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_model, trit
from test_import_gguf import SIZES, _dense, _state

from trit import format as fmt
from trit import ggml
from trit.arch import is_decoder_linear
from trit.configs import AbsmeanConfig, Layout
from trit.convert import convert
from trit.export_gguf import export_gguf
from trit.gguf_file import gguf_name, read_gguf, unpermute_rows

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the test extra")

QTYPES = ("q2_0", "tq2_0", "tq1_0")


def _ckpt(root: Path, model_type: str, group: int, **layout) -> Path:
    src = make_tiny_model(root / f"{model_type}-float", model_type=model_type, std=0.05, **SIZES)
    out = root / f"{model_type}-g{group}"
    convert(src, out, AbsmeanConfig(group), Layout(**layout), progress=False)
    return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    return {"llama": _ckpt(root, "llama", 256), "qwen3": _ckpt(root, "qwen3", 256)}


def _export(ckpt: Path, out: Path, qtype: str) -> Path:
    export_gguf(ckpt, out, qtype, log=lambda _: None)
    return out


def _llama_cpp_dequantize(path: Path, name: str) -> np.ndarray:
    """A tensor of a GGUF file as llama.cpp's own ``dequantize_row_*`` reads it (ggml's C, through ctypes)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    g = read_gguf(path)
    info = g.tensors[name]
    f = ggml.by_id(info.type_id, info.numel, info.extent)
    fn = getattr(lib, f"dequantize_row_{f.name.lower()}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    raw = np.ascontiguousarray(np.array(g.data(info, info.numel // f.block * f.block_bytes)))
    out = np.empty(info.numel, dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, info.numel)
    return out.reshape(info.shape)


@pytest.mark.parametrize("qtype", QTYPES)
def test_llama_cpp_reads_the_exported_weights_exactly(ckpts: dict[str, Path], tmp_path: Path, qtype: str) -> None:
    ckpt = ckpts["llama"]
    path = _export(ckpt, tmp_path / "m.gguf", qtype)
    config = __import__("json").loads((ckpt / "config.json").read_text())
    for layer, w in _dense(ckpt).items():
        if layer.endswith(("q_proj", "k_proj")):  # llama.cpp's interleaved rotary order
            h = config["num_attention_heads"] if layer.endswith("q_proj") else config["num_key_value_heads"]
            w = w[torch.argsort(unpermute_rows(w.shape[0], h))]
        got = _llama_cpp_dequantize(path, gguf_name(f"{layer}.weight"))
        assert np.array_equal(got, w.numpy()), layer


def _q8(x: torch.Tensor, block: int, fp16_scale: bool) -> torch.Tensor:
    """llama.cpp's rounding of a matmul's activations: Q8_0 (blocks of 32, fp16 scale) for Q2_0, Q8_K (256, fp32)
    for TQ1_0 and TQ2_0; ``quantize_row_q8_0_ref`` / ``quantize_row_q8_K_ref`` in ggml-quants.c."""
    b = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    amax = b.abs().amax(-1, keepdim=True)
    if fp16_scale:
        d = amax / 127
        return ((b * torch.where(d > 0, 1 / d, 0)).round() * d.half().float()).reshape(x.shape)
    iscale = torch.where(amax > 0, 127 / amax, 0)
    return ((b * iscale).round().clamp(max=127) * torch.where(iscale > 0, 1 / iscale, 0)).reshape(x.shape)


# llama.cpp rounds every ternary matmul's activations to 8 bits (emulated in the reference below) and keeps K and V
# in fp16; an activation that lands on the other side of a rounding step there moves the logits by about 1-2 %
# on these models (measured: at most 2.1 %). What this catches is structure, each of which moves them by O(1): row
# order, norms, rope, the metadata's shapes; the bytes themselves are checked exactly above.
REL_TOL = 0.04


@pytest.mark.parametrize(("model_type", "qtype"), [("llama", "q2_0"), ("llama", "tq2_0"), ("qwen3", "q2_0"),
                                                   ("qwen3", "tq1_0")])
def test_llama_cpp_logits_agree_with_the_runtime(ckpts: dict[str, Path], tmp_path: Path, model_type: str,
                                                 qtype: str) -> None:
    from trit import runtime
    from trit.kernels import registry

    path = _export(ckpts[model_type], tmp_path / "m.gguf", qtype)
    ids = [1, 5, 9, 14, 3, 22, 7, 30, 11, 12, 40, 2, 8]
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=2, verbose=False)
    try:
        llm.eval(ids)
        got = torch.from_numpy(np.array(llm.scores[: len(ids)]))
    finally:
        llm.close()
    block, fp16_scale = (32, True) if qtype == "q2_0" else (256, False)
    registry.disable("cpu_native")
    try:
        model = runtime.load(ckpts[model_type], device="cpu", dtype=torch.float32).model
        hooks = [m.register_forward_pre_hook(lambda _, a: (_q8(a[0], block, fp16_scale),))
                 for name, m in model.named_modules() if is_decoder_linear(name)]
        want = model(torch.tensor([ids])).logits[0].detach()
    finally:
        registry.disable()
    for h in hooks:
        h.remove()
    assert ((got - want).norm() / want.norm()).item() < REL_TOL


@pytest.mark.parametrize("qtype", QTYPES)
def test_export_then_import_returns_the_same_codes_and_scales(ckpts: dict[str, Path], tmp_path: Path,
                                                              qtype: str) -> None:
    ckpt = ckpts["qwen3"]
    path = _export(ckpt, tmp_path / "m.gguf", qtype)
    trit("import", path, tmp_path / "back", "--quiet")
    before, after = _state(ckpt), _state(tmp_path / "back")
    for layer in fmt.layer_names(before):
        for leaf in (fmt.PACKED_SUFFIX, fmt.SCALE_SUFFIX):
            assert torch.equal(after[f"{layer}.{leaf}"], before[f"{layer}.{leaf}"]), f"{layer}.{leaf}"


def test_groups_that_split_a_block_are_refused_or_rounded_again(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path, "llama", 64)
    refused = trit("export", ckpt, tmp_path / "m.gguf", "--type", "tq2_0", check=False)
    assert refused.returncode == 2
    assert "group size 64 does not hold whole TQ2_0 blocks of 256" in refused.stderr, refused.stderr
    assert list(tmp_path.glob("*.gguf")) == [] and list(tmp_path.glob(".m.gguf*")) == []
    done = trit("export", ckpt, tmp_path / "m.gguf", "--type", "tq2_0", "--requantize")
    assert "rounded again (--requantize): 14 layers, relative weight error" in done.stdout
    assert trit("export", ckpt, tmp_path / "q.gguf", "--type", "q2_0").returncode == 0  # groups of 64: exact


def test_a_layer_of_two_planes_is_refused(tmp_path: Path) -> None:
    import json

    ckpt = _ckpt(tmp_path, "llama", 64)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"]["layer_planes"] = {"model.layers.0.mlp.down_proj": 2}  # as a bits budget writes
    (ckpt / "config.json").write_text(json.dumps(config))
    refused = trit("export", ckpt, tmp_path / "m.gguf", "--type", "q2_0", check=False)
    assert refused.returncode == 2 and "layers of 2 trit-planes; a GGUF tensor holds one" in refused.stderr
    assert list(tmp_path.glob("*.gguf")) == [] and list(tmp_path.glob(".m.gguf*")) == []


def test_scales_fp16_cannot_hold_are_refused_unless_rounded(tmp_path: Path) -> None:
    bf16 = _ckpt(tmp_path, "llama", 256, scale_dtype="bfloat16")  # 8 bits of mantissa: fp16 holds them exactly
    assert "exact" in trit("export", bf16, tmp_path / "b.gguf").stdout
    fp32 = _ckpt(tmp_path, "qwen3", 256, scale_dtype="float32")
    refused = trit("export", fp32, tmp_path / "m.gguf", check=False)
    assert refused.returncode == 2 and "fp16 (GGUF's block scale) does not hold" in refused.stderr, refused.stderr
    assert "rounded again (--requantize)" in trit("export", fp32, tmp_path / "m.gguf", "--requantize").stdout


def test_embeddings_q8_0(ckpts: dict[str, Path], tmp_path: Path) -> None:
    path = _export(ckpts["llama"], tmp_path / "m.gguf", "q2_0")
    export_gguf(ckpts["llama"], tmp_path / "q8.gguf", "q2_0", embeddings="q8_0", log=lambda _: None)
    assert read_gguf(tmp_path / "q8.gguf").tensors["token_embd.weight"].type_id == 8
    assert (tmp_path / "q8.gguf").stat().st_size < path.stat().st_size
    llm = llama_cpp.Llama(str(tmp_path / "q8.gguf"), n_ctx=32, n_threads=2, verbose=False)
    try:
        llm.eval([1, 5, 9])
    finally:
        llm.close()


def test_a_sentencepiece_style_tokenizer_needs_its_gguf(ckpts: dict[str, Path], tmp_path: Path) -> None:
    """Llama 2's and Mistral's tokenizer.json are BPE over U+2581-spelled pieces, not byte-level: llama.cpp's gpt2
    vocabulary would split text differently, so the export asks for the model's own GGUF tokenizer."""
    import json
    import shutil

    ckpt = Path(shutil.copytree(ckpts["llama"], tmp_path / "ckpt"))
    spec = json.loads((ckpt / "tokenizer.json").read_text())
    spec["model"] = {"type": "BPE", "vocab": spec["model"]["vocab"], "merges": []}
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    (ckpt / "tokenizer.json").write_text(json.dumps(spec))
    refused = trit("export", ckpt, tmp_path / "m.gguf", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "tokenizer.json" in refused.stderr and "--tokenizer-from" in refused.stderr, refused.stderr
    assert not (tmp_path / "m.gguf").exists()
