"""Import a ternary GGUF file (llama.cpp's TQ1_0, TQ2_0 and Q2_0; PrismML's PQ2_0 and PTQ1_0; bitnet.cpp's
I2_S) into trit format 1, exactly: the codes as stored, each block's scale as its group's scale.

``trit import MODEL.gguf OUT_DIR`` reads the file's own table (:mod:`trit.gguf_file`) and writes a trit
checkpoint that loads in the runtime, ``from_pretrained`` and vLLM:

- architectures ``llama``, ``qwen2``, ``qwen3`` and BitNet (mainline's ``bitnet``, bitnet.cpp's
  ``bitnet-b1.58``: SiLU; ``bitnet-25``, BitNet b1.58 2B4T: squared ReLU, as their converters write them),
  config.json from the file's metadata, the tokenizer from its ``tokenizer.ggml.*`` keys (transformers' GGUF
  tokenizer reader);
- every ternary tensor's codes unchanged; the group size is the block size (64, 128 or 256), the smallest one
  where blocks differ between tensors (a larger block's scale repeated, exact), or one scale a row where every
  row's blocks share theirs; bitnet.cpp's per-tensor scale (and a BitNet file's ``*.scale`` tensors) folded into
  the row scales; a block whose code is 3 (Q2_0's +2) in a layer imported as ternary is refused;
- llama's Q and K rows put back in Hugging Face's rotary order (llama.cpp's converter interleaves them);
- other tensors (embeddings, norms, a float or K-quant layer) dequantized by the ``gguf`` package; a decoder
  layer stored that way stays in high precision (``modules_not_converted``);
- BitNet models run W1.58A8 (int8 activations per token), the others bf16 activations, as they were trained.

Anything else is refused with the tensor named and nothing written: an architecture trit does not serve, a
tensor whose bytes do not fit its type (a truncated file, a block size no type has, bitnet.cpp's ids where
mainline's were meant), Llama 3.1's rope scaling or PrismML's folded Hadamard rotation (not read yet).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from trit import format as fmt
from trit import ggml
from trit.arch import is_decoder_linear
from trit.checkpoint import CONFIG_FILE, CheckpointError, atomic_folder, write_tensors
from trit.convert import ALWAYS_KEPT, ConvertReport, LayerReport
from trit.errors import ConvertError
from trit.gguf_file import (
    DEFAULT_ALIGNMENT,
    GGUFFile,
    TensorInfo,
    hf_name,
    read_gguf,
    unpermute_rows,
    write_metadata_only,
)

# GGUF architecture -> (transformers model_type, the MLP's activation)
ARCHS = {"llama": ("llama", "silu"), "qwen2": ("qwen2", "silu"), "qwen3": ("qwen3", "silu"),
         "bitnet": ("bitnet", "silu"), "bitnet-b1.58": ("bitnet", "silu"), "bitnet-25": ("bitnet", "relu2")}
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "bitnet": "BitNetForCausalLM"}
FLOAT_TYPES = {0: np.float32, 1: np.float16}  # F32, F16; BF16 (30) is read as its bits


def hf_config(g: GGUFFile) -> dict:
    """config.json of the model a GGUF file holds, from its metadata."""
    model_type, act = ARCHS[g.arch]
    hidden, heads = int(g.get("embedding_length")), int(g.get("attention.head_count"))
    vocab = len(g.metadata.get("tokenizer.ggml.tokens", [])) or int(g.get("vocab_size", 0))
    if "token_embd.weight" in g.tensors:
        vocab = g.tensors["token_embd.weight"].shape[0]
    config = {
        "architectures": [CLASSES[model_type]], "model_type": model_type, "hidden_size": hidden,
        "intermediate_size": int(g.get("feed_forward_length")), "num_hidden_layers": int(g.get("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(g.get("attention.head_count_kv", heads)),
        "head_dim": int(g.get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(g.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g.get("context_length", 4096)), "vocab_size": vocab,
        "hidden_act": act, "tie_word_embeddings": "output.weight" not in g.tensors, "torch_dtype": "bfloat16",
    }
    for key, tok in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if tok in g.metadata:
            config[key] = int(g.metadata[tok])
    if model_type == "qwen2":
        config["use_sliding_window"] = False
    return config


def _check_supported(g: GGUFFile) -> None:
    if g.arch not in ARCHS:
        raise CheckpointError(g.path, f"general.architecture {g.arch!r}: trit imports {', '.join(ARCHS)}")
    if "rope_freqs.weight" in g.tensors:
        raise CheckpointError(g.path, "rope_freqs.weight: Llama 3.1's rope scaling is not read yet")
    scaling = g.get("rope.scaling.type")
    if scaling not in (None, "none") and float(g.get("rope.scaling.factor", 1.0)) != 1.0:
        raise CheckpointError(g.path, f"rope scaling {scaling!r}: not read yet")
    folded = sorted(k for k in g.metadata if k.startswith("prism.hadamard"))
    if folded:
        raise CheckpointError(g.path, f"{folded[0]}: a Hadamard rotation folded into the weights (Bonsai-2); not "
                                      "read yet")


@dataclass
class _Layer:
    """A ternary decoder layer as the file holds it."""

    info: TensorInfo
    fmt: ggml.BlockFormat

    def codes_scales(self, g: GGUFFile) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes (N, K) int8 (value + 1) and scales: (N, K / block) float32, or (N, 1) for I2_S."""
        n, k = self.info.shape
        name = self.info.name
        if self.fmt is ggml.I2_S:
            codes, scale = ggml.decode_i2_s(torch.from_numpy(np.array(g.data(self.info, ggml.i2_s_bytes(n * k)))),
                                            (n, k), name)
            return codes, torch.full((n, 1), scale)
        raw = torch.from_numpy(np.array(g.data(self.info, n * self.fmt.row_bytes(k)))).view(n, -1)
        codes, scales = ggml.decode(self.fmt, raw, k, name)
        if (codes == 3).any():
            raise ggml.GGMLFormatError(name, f"{self.fmt.name} codes 0, 1, 2 (a ternary layer)",
                                       f"{int((codes == 3).sum())} codes equal to 3 (+2)")
        return codes, scales.float()


FORK_IDS = {37: "I8_S", 38: "TL1", 39: "TL2"}  # bitnet.cpp's ids beside I2_S (36); mainline's 39 is MXFP4


def _format_of(g: GGUFFile, info: TensorInfo) -> ggml.BlockFormat | None:
    """The ternary format of a tensor, or None for one the ``gguf`` package reads (float, Q8_0, K-quants); a tensor
    whose bytes do not fill its type's size (to within the file's alignment) is refused."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if info.type_id in FORK_IDS and (g.arch.startswith("bitnet-") or info.type_id != 39):
        raise ggml.GGMLFormatError(info.name, "a tensor type trit reads (bitnet.cpp files: I2_S)",
                                   f"bitnet.cpp's {FORK_IDS[info.type_id]} (its fork's type id {info.type_id}), a "
                                   "kernel-specific layout; convert the model to I2_S with bitnet.cpp")
    fmt_ = ggml.by_id(info.type_id, info.numel, info.extent)
    if fmt_ is None and info.type_id == ggml.Q2_0.type_id:
        raise ggml.GGMLFormatError(info.name, "Q2_0 (type id 42): 18 bytes a block of 64 weights, or 34 a block of "
                                   "128 (PrismML's first files)", f"{info.extent} bytes for {info.numel} weights, a "
                                   "block size no type has")
    if fmt_ is None and info.type_id not in {t.value for t in GGMLQuantizationType}:
        raise ggml.GGMLFormatError(info.name, "a tensor type trit or the gguf package reads (TQ1_0, TQ2_0, Q2_0, "
                                   "PQ2_0, PTQ1_0, I2_S; float; Q8_0; K-quants)", f"type id {info.type_id}")
    if fmt_ is None:
        what = GGMLQuantizationType(info.type_id).name
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type_id)]
        need = info.numel // block * size
    else:
        what = fmt_.name
        need = ggml.i2_s_bytes(info.numel) if fmt_ is ggml.I2_S else info.numel // fmt_.block * fmt_.block_bytes
        if len(info.shape) != 2 or info.shape[1] % fmt_.block:
            raise ggml.GGMLFormatError(info.name, f"{fmt_.name}: rows of whole blocks of {fmt_.block}",
                                       f"shape {info.shape}")
    alignment = int(g.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if not need <= info.extent < need + alignment:
        where = "before the next tensor" if info.extent < need + alignment else "up to the next tensor"
        raise ggml.GGMLFormatError(info.name, f"{need} bytes of {what} for {info.numel} weights",
                                   f"{info.extent} bytes {where} or the end of the file (truncated, or another "
                                   "format under this type id)")
    return fmt_


def _float(g: GGUFFile, info: TensorInfo) -> torch.Tensor:
    """A non-ternary tensor as float32 (F32, F16, BF16 as stored; the rest dequantized by the ``gguf`` package)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    if info.type_id in FLOAT_TYPES:
        dtype = FLOAT_TYPES[info.type_id]
        arr = np.array(g.data(info, info.numel * np.dtype(dtype).itemsize)).view(dtype)
        return torch.from_numpy(arr.astype(np.float32)).reshape(info.shape)
    if info.type_id == 30:  # BF16
        bits = np.array(g.data(info, info.numel * 2)).view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16).float().reshape(info.shape)
    qtype = GGMLQuantizationType(info.type_id)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.array(g.data(info, info.numel // block * size)).reshape(*info.shape[:-1], -1)
    try:
        return torch.from_numpy(quants.dequantize(raw, qtype).astype(np.float32)).reshape(info.shape)
    except NotImplementedError:
        raise ggml.GGMLFormatError(info.name, "a type the gguf package can dequantize", qtype.name) from None


def _spans(scales: torch.Tensor, r: int) -> bool:
    """Whether every run of ``r`` consecutive block scales of each row is one value (a short last run included)."""
    nb = scales.shape[1]
    padded = torch.cat([scales, scales[:, -1:].expand(-1, -nb % r)], 1)
    runs = padded.reshape(scales.shape[0], -1, r)
    return bool((runs == runs[..., :1]).all())


def _group(layers: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> int:
    """One scale a row where every row's blocks share theirs; else the widest power-of-two span, at least the
    smallest block, over which every layer's block scales repeat (an exported trit group comes back as itself)."""
    if all(s.shape[1] == 1 or _spans(s, s.shape[1]) for _, s in layers.values()):
        return fmt.PER_ROW
    blocks = {m: c.shape[1] // s.shape[1] for m, (c, s) in layers.items()}
    group = min(b for m, b in blocks.items() if layers[m][1].shape[1] > 1)
    while all(blocks[m] >= 2 * group or _spans(s, 2 * group // blocks[m]) for m, (_, s) in layers.items()):
        if 2 * group > max(c.shape[1] for c, _ in layers.values()):
            break
        group *= 2
    return group


def _group_scales(scales: torch.Tensor, block: int, group: int) -> torch.Tensor:
    """Block scales ``(N, K / block)`` -> one a trit group: repeated where groups are narrower, sampled where wider."""
    if group == fmt.PER_ROW:
        return scales[:, :1]
    return scales.repeat_interleave(block // group, 1) if group <= block else scales[:, :: group // block]


def _scale_dtype(scales: list[torch.Tensor]) -> fmt.ScaleDtype:
    """fp16 where every scale is one exactly (GGUF's blocks store fp16), else float32 (bitnet.cpp's fp32)."""
    exact = all(torch.equal(s.half().float(), s) for s in scales)
    return fmt.ScaleDtype.FLOAT16 if exact else fmt.ScaleDtype.FLOAT32


def import_gguf(path: str | Path, out_dir: str | Path, overwrite: bool = False, progress: bool = True,
                log: Callable[[str], None] = print) -> ConvertReport:
    """Write the ternary GGUF model at ``path`` as a trit checkpoint at ``out_dir``; see the module docstring."""
    from trit.checkpoint import check_paths

    path, out = Path(path), Path(out_dir)
    check_paths(path, out, overwrite)
    g = read_gguf(path)
    _check_supported(g)
    config = hf_config(g)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    names = {}
    for name in g.tensors:
        hf = hf_name(name)
        if hf is None:
            raise CheckpointError(path, f"tensor {name!r}: not a tensor of a {g.arch} model trit reads")
        names[name] = hf
    formats = {name: _format_of(g, info) for name, info in g.tensors.items()}
    start = time.perf_counter()
    log(f"importing {path} ({g.arch}, {len(g.tensors)} tensors) -> {out}")
    # the ternary decoder layers, decoded once: codes and scales (llama's Q and K rows put back)
    ternary: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    scale_of = {names[n].removesuffix(".scale"): _float(g, g.tensors[n]).reshape(-1)[0]
                for n in g.tensors if n.endswith(".scale")}
    for name, fmt_ in tqdm(formats.items(), desc="decode", unit="tensor", disable=not progress):
        module = names[name].removesuffix(".weight")
        if fmt_ is None or not is_decoder_linear(module):
            continue
        codes, scales = _Layer(g.tensors[name], fmt_).codes_scales(g)
        if module in scale_of:
            scales = scales * scale_of[module].float()
        if g.arch == "llama" and module.endswith(("q_proj", "k_proj")):
            order = unpermute_rows(codes.shape[0], heads if module.endswith("q_proj") else kv_heads)
            codes, scales = codes[order], scales[order]
        ternary[module] = (codes, scales)
    if not ternary:
        raise ConvertError(f"{path}: no ternary decoder layer (types TQ1_0, TQ2_0, Q2_0, PQ2_0, PTQ1_0, I2_S)")
    group = _group(ternary)
    scale_dtype = _scale_dtype([s for _, s in ternary.values()])
    report = ConvertReport(out)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, info in g.tensors.items():
            hf, module = names[name], names[name].rsplit(".", 1)[0]
            if name.endswith(".scale"):
                continue  # folded into the row scales above
            if module in ternary and hf.endswith(".weight"):
                codes, scales = ternary.pop(module)
                n, k = codes.shape
                s = _group_scales(scales, k // scales.shape[1], group)
                packed = fmt.pack(codes.to(torch.int8) - 1)
                stored = fmt.to_scale(s, scale_dtype, module)
                report.packed_bytes += packed.numel()
                report.scale_bytes += stored.numel() * stored.element_size()
                report.ternary_weights += n * k
                report.layers.append(LayerReport(module, (n, k), "ternary", formats[name].name))
                yield f"{module}.{fmt.PACKED_SUFFIX}", packed
                yield f"{module}.{fmt.SCALE_SUFFIX}", stored
                continue
            t = _float(g, info)
            if g.arch == "llama" and module.endswith(("q_proj", "k_proj")):
                t = t[unpermute_rows(t.shape[0], heads if module.endswith("q_proj") else kv_heads)]
            if is_decoder_linear(module):
                report.layers.append(LayerReport(module, tuple(t.shape), "kept", "stored in a float or int type"))
            yield hf, t.to(torch.bfloat16)

    kept = tuple(sorted(names[n].removesuffix(".weight") for n, f in formats.items()
                        if f is None and is_decoder_linear(names[n].removesuffix(".weight"))))
    qcfg = fmt.TritConfig(
        group_size=group, scale_dtype=scale_dtype, method="gguf", modules_not_converted=ALWAYS_KEPT + kept,
        activation=fmt.ActivationQuant.INT8_PER_TOKEN if config["model_type"] == "bitnet" else fmt.ActivationQuant.NONE,
        extra={"source": {"format": "gguf", "architecture": g.arch,
                          "types": sorted({f.name for f in formats.values() if f is not None})}},
    )
    config["quantization_config"] = qcfg.to_dict()
    with atomic_folder(out) as tmp:
        write_tensors(tmp, tensors())
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        _write_tokenizer(g, tmp)
    report.layers.sort(key=lambda r: r.name)
    report.seconds = time.perf_counter() - start
    return report


def _write_tokenizer(g: GGUFFile, folder: Path) -> None:
    """The tokenizer of the file's ``tokenizer.ggml.*`` keys, as transformers' GGUF reader builds it, saved."""
    from transformers import AutoTokenizer

    if "tokenizer.ggml.tokens" not in g.metadata:
        raise CheckpointError(g.path, "expected a tokenizer (tokenizer.ggml.tokens), found none")
    with tempfile.TemporaryDirectory() as tmp:
        meta = Path(tmp) / "tokenizer.gguf"
        write_metadata_only(g, meta, rename_arch="llama")  # transformers' reader knows llama's metadata
        try:
            tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=meta.name)
        except (ValueError, KeyError, OSError) as e:
            raise CheckpointError(g.path, f"its tokenizer ({g.metadata.get('tokenizer.ggml.model')!r}): transformers "
                                          f"cannot build it ({e})") from None
        tokenizer.save_pretrained(folder)
