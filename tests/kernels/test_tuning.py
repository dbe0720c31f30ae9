"""Which shipped tuned tables a process reads: only those tuned on this GPU's model; none elsewhere."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from trit.kernels import tuning

KEY = tuning.key(256, 4096, 14336, 64, torch.bfloat16)


def _table(folder: Path, name: str, device: str, choice_mma: dict[str, str]) -> Path:
    path = folder / name
    path.write_text(json.dumps({"device": device, "command": "trit bench kernels", "configs": {},
                                "choice": {"v1": {}, "mma": choice_mma}}))
    return path


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A tuned folder whose file names sort so that a table wrongly read would win: each other GPU's sorts last."""
    folder = tmp_path / "tuned"
    folder.mkdir()
    paths = {
        "h200": _table(folder, "h200.json", "NVIDIA H200", {KEY: "cuda_dequant_cublas"}),
        "h100": _table(folder, "h100.json", "NVIDIA H100 80GB HBM3", {KEY: "cuda_wgmma"}),
        "h100pcie": _table(folder, "a_h100_pcie.json", "NVIDIA H100 PCIe", {KEY: "cuda_imma"}),
        "a100": _table(folder, "z_a100.json", "NVIDIA A100-SXM4-80GB", {KEY: "cuda_mma"}),
        "rtx6000": _table(folder, "z_rtx6000.json", "Quadro RTX 6000", {KEY: "cuda_gemv"}),
    }
    monkeypatch.setattr(tuning, "SHIPPED", folder)
    monkeypatch.setenv("TRIT_CACHE", str(tmp_path / "cache"))  # no user cache
    monkeypatch.setattr(tuning, "_TABLES", None)
    monkeypatch.setattr(tuning, "_TABLES_DEVICE", None)
    return paths


@pytest.mark.parametrize(("device", "family"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA H200", "H200"), ("NVIDIA H200 NVL", "H200"), ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA L40S", "L40S"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "H100"),
    ("NVIDIA GeForce RTX 5090 D v2", "NVIDIA GeForce RTX 5090 D v2"),  # not "v2"
    # bare numbers recur across generations: only the exact name
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"), ("Quadro RTX 6000", "Quadro RTX 6000"),
    ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation"),
])
def test_the_model_a_table_is_read_on(device: str, family: str) -> None:
    assert tuning.family(device) == family


@pytest.mark.parametrize(("device", "want"), [
    (None, []),                                          # no GPU in use: no table
    ("NVIDIA H200", ["h200"]),
    ("NVIDIA H100 80GB HBM3", ["h100pcie", "h100"]),     # its model's tables, its own last
    ("NVIDIA H100 PCIe", ["h100", "h100pcie"]),
    ("NVIDIA H100 NVL", ["h100pcie", "h100"]),           # no exact table: the model's, by name
    ("NVIDIA A100 80GB PCIe", ["a100"]),
    ("NVIDIA RTX 6000 Ada Generation", []),              # not the Quadro's table, and never another GPU's
    ("Quadro RTX 6000", ["rtx6000"]),
    ("NVIDIA L40S", []),
])
def test_only_the_tables_of_this_gpus_model(shipped: dict[str, Path], device: str | None,
                                            want: list[str]) -> None:
    assert tuning.shipped_tables(device) == [shipped[name] for name in want]


def test_this_gpus_tables_answer_and_another_gpus_are_not_read(
        shipped: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    for device, want in (("NVIDIA H100 80GB HBM3", "cuda_wgmma"), ("NVIDIA H100 PCIe", "cuda_imma"),
                         ("NVIDIA H200", "cuda_dequant_cublas"), ("NVIDIA A100-SXM4-40GB", "cuda_mma"),
                         ("NVIDIA GeForce RTX 4090", None)):
        monkeypatch.setattr(tuning, "_device_name", lambda device=device: device)
        tuning.reset()
        assert tuning.preferred(KEY, "mma") == want, device


def test_the_tables_are_read_again_once_cuda_is_in_use(shipped: dict[str, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Read first before any CUDA work (no device: no table), then on the GPU: its own table counts, and what was
    worked out from the first reading is stale."""
    device: list[str | None] = [None]
    asked = [0]

    def name() -> str | None:
        asked[0] += 1
        return device[0]

    monkeypatch.setattr(tuning, "_device_name", name)
    assert tuning.preferred(KEY, "mma") is None
    assert tuning.memo("worked out", lambda: 1) == 1
    device[0] = "NVIDIA H100 80GB HBM3"
    assert tuning.memo("worked out", lambda: 2) == 2  # the GPU came into use: read again, the cache emptied
    assert tuning.preferred(KEY, "mma") == "cuda_wgmma"
    asked[0] = 0
    for _ in range(3):
        assert tuning.preferred(KEY, "mma") == "cuda_wgmma"  # not read a third time,
        assert tuning.memo("worked out", lambda: 3) == 2
    assert asked[0] == 0  # and the GPU, once found, is not asked for again


def test_picking_a_table_does_not_start_cuda(tmp_path: Path) -> None:
    """A fresh process that looks tables up and keeps a tuned config, touching no GPU, has not started CUDA and
    writes nothing to its cache (on a CPU build of torch CUDA cannot start at all; on a GPU machine this is the
    check)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from trit.kernels import tuning\n"
        "from trit.kernels.cuda.mma import MmaConfig\n"
        "k = tuning.key(1, 4096, 4096, 64, torch.bfloat16)\n"
        "assert tuning.preferred(k, 'mma') is None\n"
        "tuning.lookup('cuda_gemv', k, dict)\n"
        "tuning.remember('cuda_mma', k, MmaConfig(1, 1, 1, 3, False))\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    env = {**os.environ, "TRIT_CACHE": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
    assert list(tmp_path.iterdir()) == []


def test_the_shipped_tables_name_their_device() -> None:
    """Every table the package ships says which GPU it was tuned on, which is how a process picks it: on an
    H100 80GB HBM3 the H100 table alone, on an H200 the H200's."""
    paths = sorted(tuning.SHIPPED.glob("*.json"))
    for path in paths:
        assert json.loads(path.read_text())["device"], path.name
    assert tuning.shipped_tables("NVIDIA H100 80GB HBM3") == [tuning.SHIPPED / "h100.json"]
    assert tuning.shipped_tables("NVIDIA H200") == [tuning.SHIPPED / "h200.json"]
    assert tuning.shipped_tables("NVIDIA A100-SXM4-80GB") == []


H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def on_h100(shipped: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process on an H100 (no GPU needed), its autotuning cache under ``tmp_path / "cache"``: that file."""
    monkeypatch.setattr(tuning, "_device_name", lambda: H100)
    tuning._warn_once.cache_clear()
    return tuning.cache_file(H100)


@pytest.mark.parametrize("damage", ["{\"configs\": {\"cuda_mma\": {", "\xff\xfe not text", "[1, 2]",
                                    "{\"configs\": {\"cuda_mma\": [1]}}", "{\"choice\": {\"mma\": {\"k\": 3}}}"])
def test_a_damaged_cache_costs_its_configs_not_the_run(on_h100: Path, damage: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A cache file that is not one (cut short, edited by hand) is ignored with one warning naming it; the shipped
    tables still answer, and the next config tuned rewrites the file whole."""
    from trit.kernels.cuda.mma import MmaConfig

    on_h100.parent.mkdir(parents=True)
    on_h100.write_bytes(damage.encode("latin-1"))
    with caplog.at_level("WARNING", logger="trit.kernels.tuning"):
        assert tuning.preferred(KEY, "mma") == "cuda_wgmma"  # the H100's shipped table
        tuning.reset()
        assert tuning.preferred(KEY, "mma") == "cuda_wgmma"
    warned = [r.getMessage() for r in caplog.records if str(on_h100) in r.getMessage()]
    assert len(warned) == 1 and "ignored" in warned[0]
    tuning.remember("cuda_mma", "16,64,64,64,bfloat16", MmaConfig(2, 1, 1, 3, False))
    assert json.loads(on_h100.read_text())["configs"] == {
        "cuda_mma": {"16,64,64,64,bfloat16": dataclasses.asdict(MmaConfig(2, 1, 1, 3, False))}}
    assert on_h100.with_name(on_h100.name + ".bad").read_bytes() == damage.encode("latin-1")  # set aside, not lost
    tuning.reset()
    assert tuning.lookup("cuda_mma", "16,64,64,64,bfloat16", MmaConfig) == MmaConfig(2, 1, 1, 3, False)


def test_a_config_of_another_version_falls_back_to_the_default(on_h100: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from trit.kernels.cuda.mma import MmaConfig

    on_h100.parent.mkdir(parents=True)
    on_h100.write_text(json.dumps({"device": H100, "configs": {"cuda_mma": {
        "16,64,64,64,bfloat16": {"rt": 1, "renamed_field": 3}}}}))
    with caplog.at_level("WARNING", logger="trit.kernels.tuning"):
        assert tuning.lookup("cuda_mma", "16,64,64,64,bfloat16", MmaConfig) is None
        assert tuning.lookup("cuda_mma", "16,64,64,64,bfloat16", MmaConfig) is None
    warned = [r.getMessage() for r in caplog.records if "renamed_field" in r.getMessage()]
    assert len(warned) == 1 and "cuda_mma" in warned[0] and "default" in warned[0]


def _remember_many(worker: int, count: int, start) -> None:
    from trit.kernels.cuda.mma import MmaConfig

    start.wait(60)  # every worker begins at once
    for i in range(count):
        tuning.remember("cuda_mma", f"{worker},{i},64,64,bfloat16", MmaConfig(1 + i % 2, 1, 1, 3, False))


@pytest.mark.skipif(os.name != "posix", reason="the cache's lock is POSIX flock")
def test_processes_tuning_at_once_keep_every_config(on_h100: Path) -> None:
    """Workers of one server tune at the same time on one GPU: each merges into what the others wrote, so no
    config is lost to a read-modify-write race."""
    import multiprocessing

    from trit.kernels.cuda.mma import MmaConfig  # noqa: F401  imported before the fork, not in each child

    workers, count = 4, 40
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(workers)
    procs = [ctx.Process(target=_remember_many, args=(w, count, start)) for w in range(workers)]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(120)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    kept = json.loads(on_h100.read_text())["configs"]["cuda_mma"]
    assert sorted(kept) == sorted(f"{w},{i},64,64,bfloat16" for w in range(workers) for i in range(count))


@pytest.mark.skipif(os.name != "posix", reason="the cache's lock is POSIX flock")
def test_a_cache_that_cannot_be_locked_or_written_costs_no_run(on_h100: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A file system without locks, another user's read-only lock file, a read-only or full cache: the config
    is still used in this process, the cache is merged unlocked where it can be written, and each is said once."""
    import errno
    import fcntl

    from trit.kernels.cuda.mma import MmaConfig

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    with caplog.at_level("WARNING", logger="trit.kernels.tuning"):
        with monkeypatch.context() as m:
            m.setattr(fcntl, "flock", no_locks)
            tuning.remember("cuda_mma", "16,64,64,64,bfloat16", MmaConfig(2, 1, 1, 3, False))
        lock = on_h100.with_name(on_h100.name + ".lock")
        lock.chmod(0o444)  # read-only: still lockable
        tuning.remember("cuda_mma", "64,64,64,64,bfloat16", MmaConfig(1, 1, 1, 3, False))
        assert sorted(json.loads(on_h100.read_text())["configs"]["cuda_mma"]) == [
            "16,64,64,64,bfloat16", "64,64,64,64,bfloat16"]

        def full(path, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(tuning, "write_atomic", full)
        tuning.remember("cuda_mma", "128,64,64,64,bfloat16", MmaConfig(2, 1, 1, 3, False))
    assert tuning.lookup("cuda_mma", "128,64,64,64,bfloat16", MmaConfig) == MmaConfig(2, 1, 1, 3, False)
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot lock" in m for m in said) == 1 and sum("this process only" in m for m in said) == 1
