"""Which shipped tuned tables a process reads: the H200's everywhere, then one tuned on this GPU's family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trit.kernels import tuning


def _table(folder: Path, name: str, device: str, choice_mma: dict[str, str]) -> Path:
    path = folder / name
    path.write_text(json.dumps({"device": device, "command": "trit bench kernels", "configs": {},
                                "choice": {}, "choice_mma": choice_mma}))
    return path


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    folder = tmp_path / "tuned"
    folder.mkdir()
    key = tuning.key(256, 4096, 14336, 64, torch.bfloat16)
    paths = {
        "h200": _table(folder, "h200.json", "NVIDIA H200", {key: "cuda_dequant_cublas"}),
        "h100": _table(folder, "h100.json", "NVIDIA H100 80GB HBM3", {key: "cuda_wgmma"}),
        "a100": _table(folder, "a100.json", "NVIDIA A100-SXM4-80GB", {key: "cuda_mma"}),
    }
    monkeypatch.setattr(tuning, "SHIPPED", folder)
    monkeypatch.setenv("TRIT_CACHE", str(tmp_path / "cache"))  # no user cache
    monkeypatch.setattr(tuning, "_TABLES", None)
    return paths


@pytest.mark.parametrize(("device", "want"), [
    (None, ["h200"]),                                  # no GPU: the default table
    ("NVIDIA H200", ["h200"]),                          # read once
    ("NVIDIA H100 80GB HBM3", ["h200", "h100"]),        # the device the table was tuned on
    ("NVIDIA H100 PCIe", ["h200", "h100"]),             # another H100
    ("NVIDIA A100 80GB PCIe", ["h200", "a100"]),
    ("NVIDIA GeForce RTX 4090", ["h200"]),              # no table of its family
    ("Some GPU", ["h200"]),                             # a name without a model number
])
def test_the_default_table_then_the_tables_of_this_gpus_family(shipped: dict[str, Path], device: str | None,
                                                               want: list[str]) -> None:
    assert tuning.shipped_tables(device) == [shipped[name] for name in want]


def test_a_family_table_overrides_the_default_and_another_gpus_table_is_not_read(
        shipped: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    key = tuning.key(256, 4096, 14336, 64, torch.bfloat16)
    for device, want in (("NVIDIA H100 80GB HBM3", "cuda_wgmma"), ("NVIDIA H200", "cuda_dequant_cublas"),
                         ("NVIDIA A100-SXM4-40GB", "cuda_mma")):
        monkeypatch.setattr(tuning, "_device_name", lambda device=device: device)
        tuning.reset()
        assert tuning.preferred(key, "choice_mma") == want, device
    tuning.reset()


def test_the_shipped_tables_name_their_device() -> None:
    """Every table the package ships says which GPU it was tuned on, which is how a process picks it."""
    paths = sorted(Path(tuning.__file__).parent.joinpath("tuned").glob("*.json"))
    assert any(p.name == tuning.DEFAULT_TABLE for p in paths)
    for path in paths:
        assert tuning._family(json.loads(path.read_text())["device"]) is not None, path.name
