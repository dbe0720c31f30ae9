"""trit.cache: where trit keeps what it makes once, and writing there whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from trit.cache import cache_dir, write_atomic


def test_the_cache_folder_follows_trit_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_a_write_is_whole_or_not_at_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "deep" / "entry.json"
    write_atomic(path, "first")
    write_atomic(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["entry.json"]
    write_atomic(tmp_path / "blob.bin", b"\x00\x01")
    assert (tmp_path / "blob.bin").read_bytes() == b"\x00\x01"

    real = Path.write_text

    def torn(self: Path, data: str) -> int:  # half the file, then the disk is full
        real(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", torn)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, "third, never whole")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["entry.json"]


def test_a_tuned_config_persists_through_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """trit.kernels.tuning keeps an autotuned config in $TRIT_CACHE/tuned-<GPU>.json, merged with what is there,
    and reads it back on that GPU only."""
    import json

    from trit.kernels import tuning
    from trit.kernels.cuda.mma import MmaConfig

    device = ["NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("TRIT_CACHE", str(tmp_path))
    monkeypatch.setattr(tuning, "_device_name", lambda: device[0])
    monkeypatch.setattr(tuning, "_TABLES", None)
    monkeypatch.setattr(tuning, "_TABLES_DEVICE", None)
    tuning.remember("cuda_mma", "16,64,64,64,bfloat16", MmaConfig(1, 1, 1, 3, False))
    tuning.remember("cuda_mma", "64,64,64,64,bfloat16", MmaConfig(2, 1, 1, 3, False))
    name = "tuned-NVIDIA-H100-80GB-HBM3.json"
    on_disk = json.loads((tmp_path / name).read_text())
    assert on_disk["device"] == device[0]
    configs = on_disk["configs"]["cuda_mma"]
    assert configs["16,64,64,64,bfloat16"]["rt"] == 1 and configs["64,64,64,64,bfloat16"]["rt"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + ".lock"]  # the writers' lock stays
    tuning.reset()  # another process on the same GPU reads it; one on another GPU does not
    assert tuning.lookup("cuda_mma", "64,64,64,64,bfloat16", MmaConfig) == MmaConfig(2, 1, 1, 3, False)
    device[0] = "NVIDIA A100-SXM4-80GB"
    tuning.reset()
    assert tuning.lookup("cuda_mma", "64,64,64,64,bfloat16", MmaConfig) is None
    device[0] = None  # no GPU in use: nothing is kept on disk
    tuning.reset()
    tuning.remember("cuda_mma", "128,64,64,64,bfloat16", MmaConfig(1, 1, 1, 3, False))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + ".lock"]
    tuning.reset()
