"""Reading Hugging Face checkpoints (float or trit) from disk, lazily and with clear errors.

A checkpoint is a folder with ``config.json`` and safetensors weights: one
``model.safetensors``, or shards listed by ``model.safetensors.index.json``.
:func:`open_checkpoint` checks all of it before anything is read: the config
parses, every shard's header is whole and its data as long as the header says
(the safetensors layout: an 8-byte little-endian header length, a JSON header of
``name -> {dtype, shape, data_offsets}``, then the data). Tensors are then read
one at a time through ``safe_open`` (memory-mapped), never the whole model.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from trit.errors import TritError

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(TritError, ValueError):
    """A checkpoint folder that cannot be read: names the file and what is wrong."""

    def __init__(self, path: Path | str, problem: str):
        self.path = str(path)
        super().__init__(f"{path}: {problem}")


_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors dtype code: "BF16", "F16", "F32", "U8", ...
    shape: tuple[int, ...]
    shard: Path

    def meta(self) -> torch.Tensor:
        """A data-less tensor of this dtype and shape, for checks that need no values."""
        dtype = _DTYPES.get(self.dtype)
        if dtype is None:
            raise CheckpointError(self.shard, f"dtype {self.dtype} is not one trit reads")
        return torch.empty(self.shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder, checked: its config and where each tensor lives."""

    path: Path
    config: dict[str, Any]
    shards: tuple[Path, ...]
    tensors: dict[str, TensorInfo]

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        return self.config.get("quantization_config")

    def shard_tensors(self, shard: Path) -> list[str]:
        return [name for name, info in self.tensors.items() if info.shard == shard]

    def iter_shard(self, shard: Path, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` of one shard, one tensor at a time."""
        with safe_open(str(shard), framework="pt", device=device) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, f.get_tensor(name)

    def open_all(self, stack: ExitStack, device: str = "cpu") -> dict[Path, Any]:
        """Open every shard (memory-mapped) for random access by tensor name."""
        return {s: stack.enter_context(safe_open(str(s), framework="pt", device=device)) for s in self.shards}


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(path, "missing: a checkpoint folder needs config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(path, f"expected a JSON object, found {type(config).__name__}")
    return config


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse one safetensors file's header and check the file holds all the data it promises."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(path, f"truncated: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CheckpointError(path, f"truncated: header of {n} bytes, but the file has {size} bytes")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(path, f"unreadable ({e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not a safetensors file: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "not a safetensors file: header is not a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        try:
            start, end = meta["data_offsets"]
            out[name] = TensorInfo(str(meta["dtype"]), tuple(int(s) for s in meta["shape"]), path)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(path, f"tensor {name!r} has a malformed header entry") from None
        if end > data_size or start > end:
            raise CheckpointError(
                path,
                f"truncated: tensor {name!r} ends at byte {end} of the data, but the file holds {data_size}",
            )
    return out


def _shard_paths(folder: Path) -> tuple[Path, ...]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise CheckpointError(index, f"not a valid safetensors index ({e})") from None
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(index, f"lists shards that are missing: {', '.join(missing)}")
        return tuple(folder / n for n in names)
    single = folder / SINGLE_FILE
    if single.is_file():
        return (single,)
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
        raise CheckpointError(folder, "holds PyTorch pickle weights only; trit reads safetensors")
    raise CheckpointError(folder, f"no {SINGLE_FILE} and no {INDEX_FILE}")


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """Check a checkpoint folder and index its tensors, reading no tensor data."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder")
    config = read_config(folder)
    shards = _shard_paths(folder)
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        for name, info in read_safetensors_header(shard).items():
            if name in tensors:
                raise CheckpointError(shard, f"tensor {name!r} also stands in {tensors[name].shard.name}")
            tensors[name] = info
    return Checkpoint(folder, config, shards, tensors)
