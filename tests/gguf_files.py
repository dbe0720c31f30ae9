"""GGUF files for the tests, written with the ``gguf`` package's writer from a float checkpoint the test makes.

Each decoder linear weight goes through a ``ternary`` function (float weight -> raw bytes and type id, or None to
keep it F16); the rest is written as llama.cpp's converter writes it (norms F32, embeddings F16, llama's Q and K
rows interleaved), with the checkpoint's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from trit import ggml
from trit.arch import is_decoder_linear
from trit.gguf_file import gguf_name, unpermute_rows

Ternary = Callable[[str, torch.Tensor], "tuple[np.ndarray, int] | None"]


def write_gguf(hf_dir: Path, out: Path, arch: str, ternary: Ternary, extra: dict | None = None,
               with_tokenizer: bool = True) -> Path:
    """``hf_dir``'s model as a GGUF of architecture ``arch``; ``extra`` adds (key, value) string or int pairs."""
    import gguf
    from safetensors.torch import load_file

    from trit.checkpoint import read_config
    from trit.export_gguf import _tokenizer, add_model_keys

    config = read_config(hf_dir)
    state = load_file(str(hf_dir / "model.safetensors"))
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), arch)
    add_model_keys(w, config)
    for key, value in (extra or {}).items():
        w.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.UINT32)
    if with_tokenizer:
        _tokenizer(w, hf_dir, config, None, lambda _: None)
    for name, t in sorted(state.items()):
        module = name.rsplit(".", 1)[0]
        t = t.float()
        if arch == "llama" and module.endswith(("q_proj", "k_proj")):
            t = t[torch.argsort(unpermute_rows(t.shape[0], heads if module.endswith("q_proj") else kv))]
        raw = ternary(name, t) if is_decoder_linear(module) and name.endswith(".weight") else None
        if raw is not None:
            data, type_id = raw
            w.add_tensor(gguf_name(name), data.view(np.int8), raw_shape=tuple(t.shape), raw_dtype=type_id)
        elif t.dim() == 1:
            w.add_tensor(gguf_name(name), t.numpy().astype(np.float32))
        else:
            w.add_tensor(gguf_name(name), t.numpy().astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def block_codes(t: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmean ternary codes (value + 1) of ``t`` (N, K) and fp16 scales a block."""
    n, k = t.shape
    b = t.reshape(n, k // block, block)
    s = b.abs().mean(-1).clamp(min=1e-4).half()
    codes = (b / s.float()[..., None]).round().clamp(-1, 1) + 1
    return codes.reshape(n, k).to(torch.int8), s


def by_format(f: ggml.BlockFormat) -> Ternary:
    """Every decoder linear rounded to ``f``'s blocks (codes 0..2) and written with trit's encoder."""
    def ternary(name: str, t: torch.Tensor) -> tuple[np.ndarray, int]:
        if f is ggml.I2_S:
            codes, _ = block_codes(t, t.shape[1])
            return ggml.encode_i2_s(codes, float(t.abs().amax())).numpy(), f.type_id  # any one scale a tensor
        codes, s = block_codes(t, f.block)
        return ggml.encode(f, codes, s).numpy(), f.type_id
    return ternary


def by_gguf_quantizer(qtype: str) -> Ternary:
    """Every decoder linear through the ``gguf`` package's own quantizer (TQ1_0, TQ2_0)."""
    from gguf import GGMLQuantizationType, quants

    q = GGMLQuantizationType[qtype]

    def ternary(name: str, t: torch.Tensor) -> tuple[np.ndarray, int]:
        return quants.quantize(t.numpy(), q), q.value
    return ternary


def dequantized(path: Path, name: str) -> torch.Tensor:
    """A ternary tensor of a GGUF file as float32 values (N, K), from its bytes, in the file's row order."""
    from trit.gguf_file import read_gguf

    g = read_gguf(path)
    info = g.tensors[name]
    n, k = info.shape
    f = ggml.by_id(info.type_id, info.numel, info.extent)
    if f is ggml.I2_S:
        codes, scale = ggml.decode_i2_s(torch.from_numpy(np.array(g.data(info, ggml.i2_s_bytes(n * k)))), (n, k))
        return (codes.float() - 1) * scale
    raw = torch.from_numpy(np.array(g.data(info, n * f.row_bytes(k)))).view(n, -1)
    codes, s = ggml.decode(f, raw, k)
    return (codes.float() - 1) * s.float().repeat_interleave(f.block, 1)
