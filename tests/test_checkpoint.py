"""Reading checkpoint folders: every broken input is refused before any tensor is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trit.checkpoint import CheckpointError, open_checkpoint


def test_opens_single_and_sharded(tiny_llama: Path, tmp_path: Path) -> None:
    from conftest import make_tiny_model

    one = open_checkpoint(tiny_llama)
    assert len(one.shards) == 1 and "model.embed_tokens.weight" in one.tensors
    many = open_checkpoint(make_tiny_model(tmp_path / "sharded", shards=3))
    assert len(many.shards) >= 2
    assert set(many.tensors) == set(one.tensors)


def test_missing_config(tiny_llama: Path) -> None:
    (tiny_llama / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config.json: missing"):
        open_checkpoint(tiny_llama)


def test_unreadable_config(tiny_llama: Path) -> None:
    (tiny_llama / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        open_checkpoint(tiny_llama)


def test_truncated_safetensors(tiny_llama: Path) -> None:
    path = tiny_llama / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model.safetensors: truncated: tensor .* ends at byte"):
        open_checkpoint(tiny_llama)


def test_truncated_header(tiny_llama: Path) -> None:
    path = tiny_llama / "model.safetensors"
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"truncated: header of \d+ bytes"):
        open_checkpoint(tiny_llama)


def test_index_lists_missing_shard(tmp_path: Path) -> None:
    from conftest import make_tiny_model

    folder = make_tiny_model(tmp_path / "m", shards=3)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    next(folder / name for name in set(index["weight_map"].values())).unlink()
    with pytest.raises(CheckpointError, match="lists shards that are missing"):
        open_checkpoint(folder)


def test_no_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="PyTorch pickle weights only"):
        open_checkpoint(tmp_path)
