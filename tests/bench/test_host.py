"""trit.bench.host: which machine a benchmark ran on."""

from __future__ import annotations

import subprocess

from trit.bench import host


def test_the_cpu_is_named_from_cpuinfo() -> None:
    name = host.cpu_model()
    assert name and name != "unknown" and "\n" not in name


def test_the_gpu_uuid_is_asked_of_nvidia_smi_for_the_first_visible_gpu(monkeypatch) -> None:
    monkeypatch.setattr(host.shutil, "which", lambda cmd: None)
    assert host.gpu_uuid() is None  # no nvidia-smi: no figure, no error
    asked = []

    def fake_run(cmd, **kwargs):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "GPU-1234abcd\n", "")

    monkeypatch.setattr(host.shutil, "which", lambda cmd: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(host.subprocess, "run", fake_run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert host.gpu_uuid() == "GPU-1234abcd"
    assert asked[-1][:3] == ["nvidia-smi", "-i", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert host.gpu_uuid() is None and len(asked) == 1  # no GPU visible: not asked
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(host.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 6, "No devices were found\n", ""))
    assert host.gpu_uuid() is None  # nvidia-smi's error on stdout is not a UUID
