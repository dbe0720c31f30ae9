"""Export a trit checkpoint to GGUF for llama.cpp (and so ollama and LM Studio): ``trit export CKPT OUT.gguf``.

``--type q2_0`` (64-weight blocks, 2.25 bits a weight; llama.cpp since 2026-07), ``tq2_0`` or ``tq1_0``
(256-weight blocks, 2.06 and 1.69 bits). A block takes its group's scale, so the export is exact where every
block lies in one of trit's groups: Q2_0 from groups of 64 (or a multiple of 64, or one scale a row), TQ2_0 and
TQ1_0 from groups of 256 (a multiple, or one a row); a layer whose K is not a multiple of 256 goes as Q2_0, as
llama.cpp's converter falls back for such shapes. Otherwise it is refused, naming the layer and its group
size, unless ``--requantize``: each block then gets the largest magnitude of its weights as its scale and the
codes are rounded again (as llama.cpp's own quantizer rounds a float weight), and the summary prints what that
cost (the weights' relative error). Llama's Q and K rows are interleaved as llama.cpp's converter does it.

Embeddings and the output layer are written as ``--embeddings f16`` (the default) or ``q8_0``; norms as F32; a
layer kept in high precision as F16. The tokenizer goes in as llama.cpp's ``tokenizer.ggml.*`` keys: copied from
a GGUF (``--tokenizer-from``: exact, what a model converted from a GGUF should carry), or built from the
checkpoint's tokenizer.json (byte-level BPE as llama.cpp's gpt2 vocabulary, a word-level one as its SentencePiece
vocabulary, which has no byte tokens, so llama.cpp can tokenize only text spelled in it (trit's synthetic models);
a SentencePiece-style BPE is refused: its GGUF's tokenizer is what ``--tokenizer-from`` is for).
Architectures llama, qwen2 and qwen3, one trit-plane. The file is written beside ``OUT.gguf`` and moved into
place when complete.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trit import format as fmt
from trit import ggml
from trit.arch import check_architecture, is_decoder_linear
from trit.checkpoint import CheckpointError, open_checkpoint
from trit.errors import ConvertError
from trit.gguf_file import gguf_name, unpermute_rows

TYPES = {"q2_0": ggml.Q2_0, "tq2_0": ggml.TQ2_0, "tq1_0": ggml.TQ1_0}
FILE_TYPES = {"q2_0": 41, "tq2_0": 37, "tq1_0": 36}  # llama_ftype: general.file_type
EMBEDDINGS = ("f16", "q8_0")
ARCHS = ("llama", "qwen2", "qwen3")
PRE_TOKENIZER = {"qwen2": "qwen2", "qwen3": "qwen2"}  # llama.cpp's name; others: "default"


@dataclass
class ExportReport:
    out: Path
    qtype: str
    layers: int = 0
    weights: int = 0
    bytes: int = 0
    requantized: dict[str, float] = field(default_factory=dict)  # layer -> relative weight error
    as_q2_0: list[str] = field(default_factory=list)  # layers whose K no 256-block divides, written as Q2_0
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"wrote {self.out} in {self.seconds:.1f} s: {self.layers - len(self.as_q2_0)} ternary layers as "
                 f"{self.qtype.upper()}, "
                 f"{self.weights:,} weights in {self.bytes / 2**20:.1f} MiB "
                 f"({8 * self.bytes / max(1, self.weights):.3f} bits a weight)"]
        if self.as_q2_0:
            lines.append(f"  {len(self.as_q2_0)} layers as Q2_0: their K is not a multiple of {self.qtype.upper()}'s "
                         f"256-weight blocks (the first: {self.as_q2_0[0]})")
        if self.requantize_cost is not None:
            lines.append(f"  rounded again (--requantize): {len(self.requantized)} layers, relative weight error "
                         f"{self.requantize_cost:.4f} on average, {max(self.requantized.values()):.4f} at most")
        else:
            lines.append("  exact: every code and scale as the checkpoint holds them")
        return "\n".join(lines)

    @property
    def requantize_cost(self) -> float | None:
        return sum(self.requantized.values()) / len(self.requantized) if self.requantized else None


def _blocks(name: str, values: torch.Tensor, scales: torch.Tensor, group: int, qtype: ggml.BlockFormat,
            requantize: bool, report: ExportReport) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's values (N, K) in -1..1 and trit's scales -> the target's codes (N, K) and block scales (N, K / B)."""
    n, k = values.shape
    b = qtype.block
    width = k if group == fmt.PER_ROW else group
    if width % b == 0:  # every block inside one group: its scale, exactly where it fits fp16
        d = scales.float().repeat_interleave(width // b, 1)[:, : k // b]
        if torch.equal(d.half().float(), d):
            return values + 1, d
        if not torch.isfinite(d.half()).all():
            raise ConvertError(f"{name}: a scale of {d.abs().max().item():.3g} overflows fp16 (GGUF's block scale)")
        if not requantize:
            raise ConvertError(f"{name}: {scales.dtype} scales that fp16 (GGUF's block scale) does not hold "
                               "exactly; pass --requantize to round them (the summary prints the cost)")
        w = values.float() * d.repeat_interleave(b, 1)
        report.requantized[name] = ((values.float() * d.half().float().repeat_interleave(b, 1) - w).norm()
                                    / w.norm().clamp(min=1e-12)).item()
        return values + 1, d.half().float()
    if not requantize:
        raise ConvertError(f"{name}: group size {group} does not hold whole {qtype.name} blocks of {b}; export "
                           f"{'q2_0' if group % 64 == 0 else 'from groups of a multiple of the block'} exactly, or "
                           "pass --requantize to round again (the summary prints the cost)")
    w = values.float() * scales.float().repeat_interleave(width, 1)[:, :k]  # the dequantized weight
    blocks = w.reshape(n, k // b, b)
    d = blocks.abs().amax(-1).half().float()
    codes = (blocks / d.clamp(min=1e-12)[..., None]).round().clamp(-1, 1)
    err = ((codes * d[..., None] - blocks).norm() / blocks.norm().clamp(min=1e-12)).item()
    report.requantized[name] = err
    return (codes.reshape(n, k) + 1).to(torch.int8), d


def _tokenizer(writer, folder: Path, config: dict, tokenizer_from: Path | None, log: Callable[[str], None]) -> None:
    """llama.cpp's tokenizer keys: copied from a GGUF, or built from the checkpoint's tokenizer.json."""
    import gguf

    if tokenizer_from is not None:
        from trit.gguf_file import read_gguf

        src = read_gguf(tokenizer_from)
        keys = [k for k in src.metadata if k.startswith("tokenizer.")]
        if not keys:
            raise CheckpointError(tokenizer_from, "expected tokenizer.ggml.* keys, found none")
        for key in keys:
            kind, inner = src.types[key]
            value = src.metadata[key]
            if kind == 9:  # an array, of the element type the source file gave it
                writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(inner))
            else:
                writer.add_key_value(key, value, gguf.GGUFValueType(kind))
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    spec = json.loads((folder / "tokenizer.json").read_text()) if (folder / "tokenizer.json").is_file() else {}
    model = spec.get("model", {}).get("type")
    if model not in ("BPE", "WordLevel") or (model == "BPE" and "ByteLevel" not in json.dumps(spec.get("pre_tokenizer"))):
        found = f"a {model} model" + (" that is not byte-level (SentencePiece-style)" if model == "BPE" else "")
        raise CheckpointError(folder / "tokenizer.json", f"a byte-level BPE or a word-level tokenizer, found {found}; "
                                                         "pass --tokenizer-from a GGUF of the same model")
    vocab = tok.get_vocab()
    n_vocab = max(config["vocab_size"], max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    special = set(tok.all_special_ids)
    added = {t.content for t in getattr(tok, "added_tokens_decoder", {}).values()}
    for text, i in vocab.items():
        types[i] = (gguf.TokenType.CONTROL if i in special else
                    gguf.TokenType.USER_DEFINED if text in added else gguf.TokenType.NORMAL)
        # a word-level vocabulary goes as SentencePiece's, whose tokens spell a space as U+2581
        tokens[i] = text.replace(" ", "\u2581") if model == "WordLevel" else text
    pre = PRE_TOKENIZER.get(config["model_type"], "default")
    if model == "BPE":  # llama.cpp's gpt2 vocabulary, with the merges
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
    else:  # llama.cpp's llama (SentencePiece) vocabulary, every token scored alike, no space put in front
        writer.add_tokenizer_model("llama")
        writer.add_token_scores([0.0] * n_vocab)
        writer.add_add_space_prefix(False)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=model == "BPE", n_vocab=n_vocab).add_to_gguf(writer, quiet=True)
    log(f"tokenizer: {len(vocab)} tokens from tokenizer.json ({model}), llama.cpp pre-tokenizer {pre!r} (its "
        "splitting of text may differ from transformers'; --tokenizer-from a GGUF of the model carries its own)")


def export_gguf(ckpt_dir: str | Path, out_file: str | Path, qtype: str = "q2_0", embeddings: str = "f16",
                requantize: bool = False, tokenizer_from: str | Path | None = None, overwrite: bool = False,
                log: Callable[[str], None] = print) -> ExportReport:
    """Write the trit checkpoint ``ckpt_dir`` as a GGUF file ``out_file``; see the module docstring."""
    import gguf

    if qtype not in TYPES:
        raise ConvertError(f"--type {qtype}: one of {', '.join(TYPES)}")
    if embeddings not in EMBEDDINGS:
        raise ConvertError(f"--embeddings {embeddings}: one of {', '.join(EMBEDDINGS)}")
    out = Path(out_file)
    if out.exists() and not overwrite:
        raise ConvertError(f"{out} exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise ConvertError(f"{out}: its folder {out.parent} does not exist")
    ckpt = open_checkpoint(ckpt_dir)
    config = ckpt.config
    model_type = check_architecture(config, str(ckpt.path / "config.json"))
    if model_type not in ARCHS:
        raise CheckpointError(ckpt.path, f"model_type {model_type!r}: the export writes {', '.join(ARCHS)}")
    qcfg = ckpt.trit_config()
    if qcfg is None:
        raise CheckpointError(ckpt.path, "expected a trit checkpoint (quantization_config), found a float one")
    if qcfg.max_planes != 1:
        raise ConvertError(f"{ckpt.path}: layers of {qcfg.max_planes} trit-planes; a GGUF tensor holds one")
    target = TYPES[qtype]
    start = time.perf_counter()
    report = ExportReport(out, qtype)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), model_type)
    try:
        add_model_keys(writer, config)
        writer.add_vocab_size(config["vocab_size"])
        writer.add_file_type(FILE_TYPES[qtype])
        _tokenizer(writer, ckpt.path, config, Path(tokenizer_from) if tokenizer_from else None, log)
        state = _read(ckpt)
        layers = fmt.layer_names(ckpt.tensors)
        for name in sorted(state):
            module, leaf = name.rsplit(".", 1)
            t = state[name]
            if module in layers:
                if leaf != fmt.PACKED_SUFFIX:
                    continue
                n, k = t.shape[0], _in_features(config, module)
                layer_type = target
                if k % target.block and k % ggml.Q2_0.block == 0:  # as llama.cpp's converter falls back
                    layer_type = ggml.Q2_0
                    report.as_q2_0.append(module)
                elif k % target.block:
                    raise ConvertError(f"{module}: K = {k} is not a multiple of {target.name}'s blocks of "
                                       f"{target.block} (nor of Q2_0's 64)")
                values = fmt.unpack(t)[:, :k]  # (N, K) int8
                codes, scales = _blocks(module, values, state[f"{module}.{fmt.SCALE_SUFFIX}"], qcfg.group_size,
                                        layer_type, requantize, report)
                if model_type == "llama" and module.endswith(("q_proj", "k_proj")):
                    h = heads if module.endswith("q_proj") else kv_heads
                    order = torch.argsort(unpermute_rows(n, h))  # the inverse: HF order -> llama.cpp's
                    codes, scales = codes[order], scales[order]
                raw = ggml.encode(layer_type, codes, scales).numpy()
                report.layers += 1
                report.weights += n * k
                report.bytes += raw.nbytes
                if layer_type is ggml.Q2_0:  # not in the gguf package's enum: its bytes under the raw id
                    writer.add_tensor(gguf_name(f"{module}.weight"), raw.view(np.int8), raw_shape=(n, k),
                                      raw_dtype=layer_type.type_id)
                else:
                    writer.add_tensor(gguf_name(f"{module}.weight"), raw, raw_dtype=gguf.GGMLQuantizationType(
                        layer_type.type_id))
                continue
            _add_float(writer, name, t.float(), model_type, heads, kv_heads, embeddings)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.replace(out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    report.seconds = time.perf_counter() - start
    return report


def add_model_keys(writer, config: dict) -> None:
    """The architecture's shape keys of a GGUF file (``{arch}.block_count`` ...) from a config.json."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)


def _in_features(config: dict, module: str) -> int:
    from trit.arch import linear_shapes

    return linear_shapes(config)[module][1]


def _read(ckpt) -> dict[str, torch.Tensor]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        files = ckpt.open_all(stack)
        return {name: files[info.shard].get_tensor(name) for name, info in ckpt.tensors.items()}


def _add_float(writer, name: str, t: torch.Tensor, model_type: str, heads: int, kv_heads: int,
               embeddings: str) -> None:
    import gguf

    module = name.rsplit(".", 1)[0]
    if model_type == "llama" and module.endswith(("q_proj", "k_proj")) and t.dim() >= 1:
        h = heads if module.endswith("q_proj") else kv_heads
        t = t[torch.argsort(unpermute_rows(t.shape[0], h))]
    arr = t.numpy()
    if t.dim() == 1:  # norms and biases
        writer.add_tensor(gguf_name(name), arr.astype(np.float32))
    elif name in ("model.embed_tokens.weight", "lm_head.weight") and embeddings == "q8_0":
        writer.add_tensor(gguf_name(name), gguf.quants.quantize(arr.astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        if is_decoder_linear(module) or name in ("model.embed_tokens.weight", "lm_head.weight"):
            writer.add_tensor(gguf_name(name), arr.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name), arr.astype(np.float32))
