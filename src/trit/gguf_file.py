"""Reading a GGUF file's header, metadata and tensor table, whatever tensor types it holds.

The ``gguf`` package's reader refuses a whole file over one tensor type id it
does not know (mainline Q2_0, bitnet.cpp's I2_S, PrismML's PQ2_0 and PTQ1_0),
so trit reads the table itself (the format: ggml's ``docs/gguf.md``): magic
``GGUF``, version 3 (2 also reads), the counts, the key/value pairs, then a
name, dims (``ne``: innermost first), type id and offset a tensor; the data
start at the next multiple of ``general.alignment`` (32 by default). Tensor
data are memory-mapped, never read whole.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from trit.checkpoint import CheckpointError

MAGIC = b"GGUF"

DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9

# llama.cpp's tensor names and Hugging Face's, for the decoders trit reads (llama, qwen2, qwen3, BitNet)
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}
BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "attn_sub_norm": "self_attn.attn_sub_norm", "ffn_sub_norm": "mlp.ffn_sub_norm"}
_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias|scale)$")
_GGUF_OF = {v: k for k, v in BLOCK.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    ne: tuple[int, ...]  # dims, innermost first (a weight (N, K) has ne = (K, N))
    offset: int  # absolute, in the file
    extent: int  # bytes up to the next tensor (or the end of the file): its data and any alignment padding

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major shape (outermost first), as numpy and torch write it."""
        return tuple(reversed(self.ne))

    @property
    def numel(self) -> int:
        return int(np.prod(self.ne)) if self.ne else 1


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    types: dict[str, tuple[int, int | None]]  # each key's value type (and an array's element type)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """``key`` of the architecture's namespace (``{arch}.block_count``), else the key as given."""
        return self.metadata.get(f"{self.arch}.{key}", self.metadata.get(key, default))

    def data(self, info: TensorInfo, nbytes: int) -> np.ndarray:
        """The tensor's first ``nbytes`` bytes, memory-mapped (uint8)."""
        if info.offset + nbytes > self.path.stat().st_size:
            raise CheckpointError(self.path, f"tensor {info.name!r}: expected {nbytes} bytes at offset {info.offset}, "
                                             "found the file ends first (truncated)")
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(nbytes,))


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``);
    a BitNet ``*.scale`` tensor maps to its layer's name and leaf ``scale``; None for a name trit does not know."""
    if name in TOP:
        return TOP[name]
    m = _BLK.match(name)
    if m is None or m.group(2) not in BLOCK:
        return None
    return f"model.layers.{m.group(1)}.{BLOCK[m.group(2)]}.{m.group(3)}"


def gguf_name(hf: str) -> str:
    """The GGUF name of a Hugging Face tensor (``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``)."""
    top = {v: k for k, v in TOP.items()}
    if hf in top:
        return top[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.<leaf>
    return f"blk.{parts[2]}.{_GGUF_OF['.'.join(parts[3:-1])]}.{parts[-1]}"


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's Q/K interleave: HF row ``i`` is GGUF row ``index[i]``."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _read(f: BinaryIO, fmt_: str, path: Path) -> Any:
    size = struct.calcsize(fmt_)
    raw = f.read(size)
    if len(raw) != size:
        raise CheckpointError(path, "a GGUF header cut short (the file ends inside it)")
    return struct.unpack(fmt_, raw)[0]


def _string(f: BinaryIO, path: Path) -> str:
    n = _read(f, "<Q", path)
    if n > 1 << 30:
        raise CheckpointError(path, f"a GGUF string of {n} bytes: not a GGUF file, or a damaged one")
    raw = f.read(n)
    if len(raw) != n:
        raise CheckpointError(path, "a GGUF header cut short (the file ends inside a string)")
    return raw.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, path: Path) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind], path)
    if kind == STRING:
        return _string(f, path)
    if kind == ARRAY:
        inner, n = _read(f, "<I", path), _read(f, "<Q", path)
        if inner in _SCALARS and inner != 7:  # numbers: read at once
            raw = f.read(n * struct.calcsize(_SCALARS[inner]))
            return np.frombuffer(raw, dtype=np.dtype(_SCALARS[inner])).tolist()
        return [_value(f, inner, path) for _ in range(n)]
    raise CheckpointError(path, f"a GGUF value of type {kind}: expected one of 0-12")


def read_gguf(path: str | Path) -> GGUFFile:
    """The header of the GGUF file at ``path``; one :class:`CheckpointError` naming it if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "no such GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CheckpointError(path, "expected a GGUF file (magic 'GGUF'), found other bytes")
        version = _read(f, "<I", path)
        if version not in (2, 3):
            raise CheckpointError(path, f"GGUF version {version}: expected 2 or 3")
        n_tensors, n_kv = _read(f, "<Q", path), _read(f, "<Q", path)
        metadata, types = {}, {}
        for _ in range(n_kv):
            key = _string(f, path)
            kind = _read(f, "<I", path)
            if kind == ARRAY:  # peek the element type: _value reads it again
                here = f.tell()
                types[key] = (kind, _read(f, "<I", path))
                f.seek(here)
            else:
                types[key] = (kind, None)
            metadata[key] = _value(f, kind, path)
        infos = []
        for _ in range(n_tensors):
            name = _string(f, path)
            ne = tuple(_read(f, "<Q", path) for _ in range(_read(f, "<I", path)))
            infos.append((name, _read(f, "<I", path), ne, _read(f, "<Q", path)))
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-f.tell() // align) * align
    size = path.stat().st_size
    starts = sorted(start + off for *_, off in infos) + [size]
    tensors = {}
    for name, type_id, ne, off in infos:
        at = start + off
        nxt = next(s for s in starts if s > at) if at < size else size
        tensors[name] = TensorInfo(name, type_id, ne, at, nxt - at)
    return GGUFFile(path, version, metadata, tensors, types)


def _pack(kind: int, value: Any) -> bytes:
    if kind in _SCALARS:
        return struct.pack(_SCALARS[kind], value)
    if kind == STRING:
        raw = str(value).encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    raise ValueError(kind)


def write_metadata_only(src: GGUFFile, out: Path, rename_arch: str | None = None) -> None:
    """A GGUF file of ``src``'s key/value pairs and no tensors (what a tokenizer reader needs), its architecture
    renamed (``{arch}.*`` keys with it) where ``rename_arch`` is given."""
    items = []
    for key, value in src.metadata.items():
        kind, inner = src.types[key]
        if rename_arch and key == "general.architecture":
            value = rename_arch
        elif rename_arch and key.startswith(f"{src.arch}."):
            key = rename_arch + key[len(src.arch):]
        body = _pack(kind, value) if kind != ARRAY else (
            struct.pack("<IQ", inner, len(value)) + b"".join(_pack(inner, v) for v in value))
        items.append(_pack(STRING, key) + struct.pack("<I", kind) + body)
    out.write_bytes(MAGIC + struct.pack("<IQQ", 3, 0, len(items)) + b"".join(items))
