"""Hugging Face checkpoints (float or trit) on disk: read lazily, written atomically, with clear errors.

A checkpoint is a folder with ``config.json`` and safetensors weights: one
``model.safetensors``, or shards listed by ``model.safetensors.index.json``.
:func:`open_checkpoint` checks all of it before anything is read: the config
parses, every shard's header is whole and its data as long as the header says
(the safetensors layout: an 8-byte little-endian header length, a JSON header of
``name -> {dtype, shape, data_offsets}``, then the data). Tensors are then read
one at a time through ``safe_open`` (memory-mapped), never the whole model.

Writing goes through :func:`atomic_folder`: everything is written into a
temporary folder beside the output and renamed into place at the very end, so
an error or Ctrl-C leaves nothing behind (no half-written checkpoint, no
folder created for it). :func:`write_checkpoint` writes a checkpoint
transformed tensor by tensor, one output shard per input shard, that way.
"""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import re
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from trit import format as fmt
from trit.errors import ConvertError, TritError

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# small files a checkpoint folder carries besides weights, copied as they are
COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


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

    @property
    def nbytes(self) -> int:
        return self.meta().element_size() * math.prod(self.shape)

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

    def trit_config(self) -> fmt.TritConfig | None:
        """The checked trit ``quantization_config``; None for a float checkpoint."""
        q = self.quantization_config
        if q is None:
            return None
        return fmt.TritConfig.from_dict(q, where=f"{self.path / CONFIG_FILE}: quantization_config")

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


# ---------------------------------------------------------------------------- writing


# what atomic_folder adds to the output folder's name for its temporary folder: ".", ".partial-" and a pid
NAME_ROOM = len("..partial-") + 10
NAME_MAX = 255  # bytes a file name may hold on Linux's and macOS's file systems


def check_paths(src: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output folder that is, holds or lies in the source, or that holds something without ``overwrite``;
    a source that cannot be resolved (a symlink loop); an output name too long for its temporary folder."""
    name_bytes = len(out.name.encode())
    if name_bytes > NAME_MAX - NAME_ROOM:
        raise ConvertError(f"OUT_DIR {out.name[:40]}...: its name is {name_bytes} bytes; at most "
                           f"{NAME_MAX - NAME_ROOM} (a file name holds {NAME_MAX}, less what trit adds for the "
                           "temporary folder it writes first)")
    try:
        src_r, out_r = src.resolve(strict=src.is_symlink()), out.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ConvertError(f"MODEL_DIR {src}: cannot be resolved ({e})") from None
    if src_r == out_r:
        raise ConvertError(f"OUT_DIR {out} is MODEL_DIR: write the ternary checkpoint to another folder")
    if src_r in out_r.parents:
        raise ConvertError(f"OUT_DIR {out} lies inside MODEL_DIR {src}: the source folder is never written to")
    if out_r in src_r.parents:
        raise ConvertError(f"OUT_DIR {out} holds MODEL_DIR {src}: replacing it would delete the source")
    if out.exists() and not out.is_dir():
        raise ConvertError(f"OUT_DIR {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConvertError(f"OUT_DIR {out} is not empty; pass --overwrite to replace it")


MiB = 2**20


def _disk_full(e: BaseException) -> bool:
    """An error that says the disk is full (safetensors wraps the OS error in its own, with the code)."""
    text = str(e)
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text \
        or "code: 28," in text


def _free_bytes(folder: Path) -> int:
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    return shutil.disk_usage(existing).free


def _space_error(out: Path, needed: int | None, free: int) -> CheckpointError:
    need = f"needed about {needed / MiB:.1f} MiB, " if needed else ""
    return CheckpointError(out, f"no space left on device ({need}{free / MiB:.1f} MiB free before writing)")


@contextmanager
def atomic_folder(out: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out``; at the end it replaces ``out`` whole.

    On any error (or Ctrl-C) the temporary folder, and every parent folder made for it, are removed,
    and ``out`` is as it was. An existing ``out`` goes only once the new one is complete. ``needed``
    (bytes, an estimate) is refused up front when the disk has less free; a disk that fills anyway, or a
    folder that cannot be written, becomes one :class:`CheckpointError` naming ``out``.
    """
    free = _free_bytes(out.parent)
    if needed is not None and free < needed:
        raise _space_error(out, needed, free)
    remove_stale_partials(out)
    made = [p for p in reversed(out.parents) if not p.exists()]  # outermost first
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as e:
            raise CheckpointError(out, f"cannot write here: {e.strerror or e}") from None
        yield tmp
        _replace(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:  # not empty: something else wrote there meanwhile
                break
        if _disk_full(e):
            raise _space_error(out, needed, free) from None
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise CheckpointError(out, f"cannot write here: {e.strerror}") from None
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove what a killed run into ``out`` left beside it (``.<name>.partial-<pid>``, ``.<name>.old-<pid>``) where
    that process no longer exists (SIGKILL, a power cut: nothing could clean up); the ones removed."""
    removed = []
    if not out.parent.is_dir():
        return removed
    for p in out.parent.glob(f".{glob.escape(out.name)}.*-*"):
        m = re.fullmatch(rf"\.{re.escape(out.name)}\.(partial|old)-(\d+)", p.name)
        if m and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished folder into place; an existing ``out`` is removed only after."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


TensorFn = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]


def check_finite(name: str, t: torch.Tensor, shard: Path) -> None:
    if t.is_floating_point() and not torch.isfinite(t).all():
        bad = int((~torch.isfinite(t)).sum())
        raise CheckpointError(shard, f"tensor {name!r} holds {bad} NaN or Inf values")


def check_all_finite(ckpt: Checkpoint, progress: bool = False) -> None:
    """Read every tensor once (memory-mapped, one at a time) and refuse the first that holds NaN or Inf."""
    with tqdm(total=len(ckpt.tensors), desc="check", unit="tensor", disable=not progress) as bar:
        for shard in ckpt.shards:
            for name, tensor in ckpt.iter_shard(shard):
                check_finite(name, tensor, shard)
                bar.update(1)


def _write_shards(ckpt: Checkpoint, folder: Path, transform: TensorFn, progress: bool, desc: str) -> None:
    """One output shard per input shard; ``transform`` maps each input tensor to its output tensors."""
    from safetensors.torch import save_file

    n_shards = len(ckpt.shards)
    weight_map: dict[str, str] = {}
    with tqdm(total=len(ckpt.tensors), desc=desc, unit="tensor", disable=not progress) as bar:
        for i, shard in enumerate(ckpt.shards):
            out_name = SINGLE_FILE if n_shards == 1 else f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
            out: dict[str, torch.Tensor] = {}
            for name, tensor in ckpt.iter_shard(shard):
                check_finite(name, tensor, shard)
                bar.set_postfix_str(name.rsplit(".", 1)[0], refresh=False)
                out.update(transform(name, tensor))
                bar.update(1)
            save_file(out, str(folder / out_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(out, out_name))
            del out
    if n_shards > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


SHARD_BYTES = 4 * 2**30  # a shard of write_tensors closes at this size


def write_tensors(folder: Path, tensors: Iterable[tuple[str, torch.Tensor]], shard_bytes: int = SHARD_BYTES) -> None:
    """Tensors, as they come, into ``folder`` as safetensors shards of about ``shard_bytes`` (one
    ``model.safetensors``, or numbered shards and their index): one shard in memory at a time."""
    from safetensors.torch import save_file

    shards: list[list[str]] = []
    pending: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            save_file(pending, str(folder / f".shard-{len(shards)}"), metadata={"format": "pt"})
            shards.append(list(pending))
            pending, size = {}, 0

    for name, tensor in tensors:
        if size and size + tensor.numel() * tensor.element_size() > shard_bytes:
            flush()
        pending[name] = tensor.contiguous()
        size += tensor.numel() * tensor.element_size()
    flush()
    names = [SINGLE_FILE] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                                     for i in range(len(shards))]
    for i, name in enumerate(names):
        (folder / f".shard-{i}").rename(folder / name)
    if len(shards) > 1:
        weight_map = {t: name for name, held in zip(names, shards) for t in held}
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def write_checkpoint(
    ckpt: Checkpoint, out: Path, transform: TensorFn, config: dict, progress: bool = True, desc: str = "quantize",
    needed: int | None = None,
) -> None:
    """Write ``ckpt`` transformed tensor by tensor, with ``config`` and the tokenizer files, to ``out`` (atomically).

    ``needed``: about how many bytes the output takes (see :func:`atomic_folder`).
    """
    copied = [ckpt.path / name for name in COPIED_FILES if (ckpt.path / name).is_file()]
    if needed is not None:
        needed += sum(p.stat().st_size for p in copied)
    with atomic_folder(out, needed) as tmp:
        _write_shards(ckpt, tmp, transform, progress, desc)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        for path in copied:
            shutil.copy2(path, tmp / path.name)
