"""``trit plan``: the GPU memory ledger of serving a model, before it is loaded.

Weights by kind (ternary codes and scales, high-precision layers, embeddings),
the KV cache per 1K tokens and for ``batch`` sequences of ``max_seq_len``,
activations, and a fixed framework overhead; whether it fits in ``gpu_mem``,
and the longest context (at this batch) and the largest batch (at this
context) that do.

Weights come from the checkpoint's safetensors headers when there are any (the
exact bytes); from a bare config.json they are computed as trit would store
them (``--group-size``, 2 bits a weight plus scales). The KV cache is ``2 x
layers x kv_heads x head_dim`` values a token. Activations are an estimate:
the largest prefill step (``max_batched_tokens`` rows) holds its hidden
states, the MLP's inner width twice and the logits of ``batch`` rows in
float32. The overhead (CUDA context, cuBLAS workspace, CUDA graphs) is a
constant, ``--overhead``; say so when quoting a plan.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from trit import format as fmt
from trit.arch import is_decoder_linear, kv_cache_bytes, meta_model
from trit.checkpoint import CONFIG_FILE, CheckpointError, open_checkpoint
from trit.kernels import int8_rows

GiB = 2**30
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float32": 4}
DEFAULT_OVERHEAD = int(1.5 * GiB)
DEFAULT_MAX_BATCHED_TOKENS = 8192


class PlanError(CheckpointError):
    pass


def parse_size(text: str, what: str = "--gpu-mem") -> int:
    """``"24GiB"``, ``"80GB"``, ``"512MiB"``, ``"1e9"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise PlanError(what, f"expected a size such as 24GiB, 80GB or 512MiB, found {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class PlanOptions:
    gpu_mem: int = 24 * GiB
    max_seq_len: int = 8192
    batch: int = 1
    kv_cache_dtype: str = "auto"  # auto: the model dtype (2 bytes)
    dtype_bytes: int = 2  # activations and high-precision weights (bf16)
    group_size: int = fmt.DEFAULT_GROUP_SIZE  # for a float config: how trit would store it
    overhead: int = DEFAULT_OVERHEAD
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    # for a float config: trit quantize's default rotation (gptq) gives a tied model of a rotatable type an
    # lm_head of its own, beside the embeddings
    rotate: bool = True

    def __post_init__(self) -> None:
        for flag, value in (("--gpu-mem", self.gpu_mem), ("--max-seq-len", self.max_seq_len), ("--batch", self.batch),
                            ("--max-batched-tokens", self.max_batched_tokens)):
            if not isinstance(value, int) or value < 1:
                raise PlanError(flag, f"expected a positive number, found {value!r}")


@dataclass
class Plan:
    weights: dict[str, int] = field(default_factory=dict)  # kind -> bytes
    kv_per_token: int = 0
    kv_total: int = 0
    activations: int = 0
    overhead: int = 0
    gpu_mem: int = 0
    max_seq_len_fit: int = 0
    max_batch_fit: int = 0
    max_position_embeddings: int | None = None
    source: str = ""

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + self.kv_total + self.activations + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_mem

    def table(self, opts: PlanOptions) -> str:
        def row(label: str, nbytes: int) -> str:
            return f"  {label:<34}{nbytes / GiB:9.3f} GiB"

        lines = [f"memory plan ({self.source}); batch {opts.batch}, max_seq_len {opts.max_seq_len}, "
                 f"KV cache {opts.kv_cache_dtype}"]
        lines += [row(f"weights, {kind}", b) for kind, b in self.weights.items()]
        lines += [
            row("KV cache per 1K tokens", self.kv_per_token * 1024),
            row(f"KV cache, {opts.batch} x {opts.max_seq_len} tokens", self.kv_total),
            row("activations (estimate)", self.activations),
            row("framework overhead (assumed)", self.overhead),
            row("total", self.total) + f" of {self.gpu_mem / GiB:.1f} GiB: " + ("fits" if self.fits else "DOES NOT FIT"),
            f"  longest context at batch {opts.batch}: {self.max_seq_len_fit} tokens by memory"
            + (f" (the model's own limit: {self.max_position_embeddings})" if self.max_position_embeddings else "")
            + f"; largest batch at {opts.max_seq_len} tokens: {self.max_batch_fit}",
        ]
        return "\n".join(lines)


def _read_config(path: Path) -> tuple[dict, Path]:
    folder = path.parent if path.is_file() else path
    cfg_path = path if path.is_file() else path / CONFIG_FILE
    if not cfg_path.is_file():
        raise PlanError(cfg_path, "missing: give a checkpoint folder or its config.json")
    try:
        return json.loads(cfg_path.read_text()), folder
    except json.JSONDecodeError as e:
        raise PlanError(cfg_path, f"not valid JSON ({e})") from None


def _weights_from_headers(folder: Path) -> dict[str, int] | None:
    try:
        ckpt = open_checkpoint(folder)
    except CheckpointError:
        return None
    out = {"ternary (codes, scales)": 0, "embeddings and lm_head": 0, "other high precision": 0}
    for name, info in ckpt.tensors.items():
        nbytes = info.meta().element_size() * math.prod(info.shape)
        if name.rsplit(".", 1)[1] in fmt.TERNARY_SUFFIXES:
            out["ternary (codes, scales)"] += nbytes
        elif name.startswith(("model.embed_tokens", "lm_head")):
            out["embeddings and lm_head"] += nbytes
        else:
            out["other high precision"] += nbytes
    return out


def _config_quant(cfg: dict, opts: PlanOptions) -> tuple[int, dict[str, int], int]:
    """The group size, the layers' plane counts and the default a trit config records; ``--group-size`` and one
    plane for a float config."""
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") != fmt.QUANT_METHOD:
        return opts.group_size, {}, 1
    return q.get("group_size", opts.group_size), dict(q.get("layer_planes") or {}), q.get("planes", 1)


def _weights_from_config(folder: Path, cfg: dict, opts: PlanOptions) -> dict[str, int]:
    """Bytes as trit would store the model: decoder linears ternary, the rest in the activation dtype."""
    from torch import nn

    model = meta_model(folder)
    group, layer_planes, planes = _config_quant(cfg, opts)
    out = {"ternary (codes, scales)": 0, "embeddings and lm_head": 0, "other high precision": 0}
    seen = set()
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and is_decoder_linear(name):
            (p_shape, s_shape) = fmt.expected_shapes(mod.out_features, mod.in_features, group)
            out["ternary (codes, scales)"] += layer_planes.get(name, planes) * (math.prod(p_shape) + 2 * math.prod(s_shape))
            seen.add(id(mod.weight))
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        kind = "embeddings and lm_head" if name.startswith(("model.embed_tokens", "lm_head")) else "other high precision"
        out[kind] += p.numel() * opts.dtype_bytes
    out["embeddings and lm_head"] += _rotated_head_bytes(cfg, opts)
    return out


def _rotated_head_bytes(cfg: dict, opts: PlanOptions) -> int:
    """The bytes of the lm_head that trit quantize's default rotation writes for a tied float model (it counts
    once above, shared with the embeddings), else 0."""
    from trit.quant.rotate import ROTATABLE_MODEL_TYPES

    text = cfg.get("text_config", cfg)
    q = cfg.get("quantization_config") or {}
    tied = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    if not opts.rotate or not tied or q.get("quant_method") == fmt.QUANT_METHOD:
        return 0
    if cfg.get("model_type") not in ROTATABLE_MODEL_TYPES:
        return 0
    return text["vocab_size"] * text["hidden_size"] * opts.dtype_bytes


def plan(path: str | Path, opts: PlanOptions = PlanOptions()) -> Plan:
    cfg, folder = _read_config(Path(path))
    text = cfg.get("text_config", cfg)
    missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                           "vocab_size") if k not in text]
    if missing:
        raise PlanError(folder / CONFIG_FILE, f"expected a decoder config with {missing[0]}")
    hidden, inter, vocab = text["hidden_size"], text["intermediate_size"], text["vocab_size"]
    if opts.kv_cache_dtype not in _DTYPE_BYTES:
        raise PlanError("--kv-cache-dtype", f"expected one of {', '.join(_DTYPE_BYTES)}, found {opts.kv_cache_dtype!r}")
    weights = _weights_from_headers(folder)
    source = "weights from the safetensors headers"
    from_headers = weights is not None
    if weights is None:
        weights = _weights_from_config(folder, cfg, opts)
        source = f"weights computed from config.json, group {_config_quant(cfg, opts)[0]}"
        if _rotated_head_bytes(cfg, opts):
            source += "; the tied lm_head written as its own tensor (quantize's default rotation; --no-rotate: not)"
    q = cfg.get("quantization_config") or {}
    head = fmt.TritConfig.from_dict(q).lm_head if q.get("quant_method") == fmt.QUANT_METHOD else None
    if head is not None and int8_rows.head_choice(head) == "int8":
        # the head's int8 rows and scales; untied, in place of the stored matrix; tied, beside the embeddings
        tied = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        stored = 0 if tied else vocab * hidden * opts.dtype_bytes  # what the count above holds for an untied head
        info = open_checkpoint(folder).tensors.get("lm_head.weight") if from_headers else None
        if info is not None:  # counted from the headers: at the dtype it is stored in
            stored = info.meta().element_size() * math.prod(info.shape)
        weights["embeddings and lm_head"] += vocab * hidden + 4 * vocab - stored
        source += "; lm_head in int8 rows"
    p = Plan(weights=weights, source=source, gpu_mem=opts.gpu_mem, overhead=opts.overhead,
             max_position_embeddings=text.get("max_position_embeddings"))
    p.kv_per_token = kv_cache_bytes(text, 1, _DTYPE_BYTES[opts.kv_cache_dtype])
    p.kv_total = p.kv_per_token * opts.batch * opts.max_seq_len
    rows = min(opts.max_batched_tokens, opts.batch * opts.max_seq_len)
    p.activations = rows * (4 * hidden + 2 * inter) * opts.dtype_bytes + opts.batch * vocab * 4
    free = opts.gpu_mem - sum(weights.values()) - p.activations - p.overhead
    p.max_seq_len_fit = max(0, free // (p.kv_per_token * opts.batch))
    p.max_batch_fit = max(0, free // (p.kv_per_token * opts.max_seq_len))
    return p
