"""``trit bench kernels`` without a GPU: its layer shapes, the refusal of a model it has none for, the
environment its JSON records, and the refusal to merge into another GPU's table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trit.bench import kernels


def test_the_layer_shapes_are_the_models_of_the_other_benchmarks() -> None:
    """qkv, o, gate_up and down of each model as ``trit bench decode`` and ``serve`` build it (their configs), and
    BitNet b1.58 2B4T's (hidden 2560, intermediate 6912, 20 heads and 5 KV heads of 128), timed on request."""
    assert kernels.SHAPES == {
        "llama3-8b": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)),
        "qwen2-1.5b": (("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960)),
        "27b": (("qkv", 8192, 5376), ("o", 5376, 4096), ("gate_up", 43008, 5376), ("down", 5376, 21504)),
        "bitnet-2b4t": (("qkv", 3840, 2560), ("o", 2560, 2560), ("gate_up", 13824, 2560), ("down", 2560, 6912)),
    }
    assert kernels.DEFAULT_MODELS == ("llama3-8b", "qwen2-1.5b", "27b")


def test_an_unknown_model_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kernels.main(tmp_path / "out", models=("llama3-8b", "nope")) == 2
    err = capsys.readouterr().err
    assert "no layer shapes for nope" in err and "27b" in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_written_json_records_the_trit_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run under ``TRIT_LAYOUT=mma`` (or any ``TRIT_`` switch) says so in ``kernels.json``; other variables do not
    appear. The device is stubbed: the file is written the same way without a GPU."""
    pytest.importorskip("triton")  # the JSON records its version
    monkeypatch.setenv("TRIT_LAYOUT", "mma")
    monkeypatch.setenv("NOT_TRIT_VAR", "x")
    monkeypatch.setattr(kernels.torch.cuda, "get_device_name", lambda *a: "stub GPU")
    row = kernels.Row(model="llama3-8b", layer="o", n=4096, k=4096, m=1, kernel="cuda_gemv", trit_us=2.0,
                      bf16_us=6.0, reference_us=50.0, trit_bytes=1, bf16_bytes=1, trit_gbps=1.0, bf16_gbps=1.0,
                      trit_frac_copy_bw=0.5, speedup_vs_bf16=3.0, rel_err_vs_reference=0.0)
    result = kernels._write(tmp_path, [row], {}, 3e12, 50 * 2**20, 0.0)
    on_disk = json.loads((tmp_path / "kernels.json").read_text())
    assert on_disk == result
    assert on_disk["env"]["TRIT_LAYOUT"] == "mma"
    assert "NOT_TRIT_VAR" not in on_disk["env"]
    assert on_disk["device"] == "stub GPU"


def test_a_table_of_another_gpu_model_is_not_merged_into(tmp_path: Path) -> None:
    """``--tuned-out`` onto a table tuned on another GPU, even another variant of the model, is refused before
    any work (a merge would mix the two GPUs' entries under this one's name); a table of this GPU, a new file,
    or none are taken."""
    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "configs": {}, "choice": {}}))
    why = kernels.table_mismatch(h100, "NVIDIA H200")
    assert why is not None and str(h100) in why and "NVIDIA H100 80GB HBM3" in why and "NVIDIA H200" in why
    assert "NVIDIA H100 PCIe" in kernels.table_mismatch(h100, "NVIDIA H100 PCIe")
    assert kernels.table_mismatch(h100, "NVIDIA H100 80GB HBM3") is None
    assert kernels.table_mismatch(tmp_path / "new.json", "NVIDIA H200") is None
    assert kernels.table_mismatch(None, "NVIDIA H200") is None
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not a tuned table" in kernels.table_mismatch(broken, "NVIDIA H200")


def test_the_mma_layouts_kernels_are_tuned_each_in_its_range_with_dequantize_beside_the_gemms() -> None:
    from trit.kernels.cuda import imma, mma, wgmma

    assert kernels.tiled_kernels(1, True) == ["cuda_imma", "cuda_gemv", "cuda_mma"]
    assert kernels.tiled_kernels(16, True) == ["cuda_imma", "cuda_wgmma", "cuda_mma", "cuda_dequant_cublas"]
    assert "cuda_imma" not in kernels.tiled_kernels(imma.MAX_M + 1, True)
    # above the mma kernel's range the wgmma kernel is still timed against dequantize + cuBLAS (it won at 512 rows
    # on an H100), so a tuned table can name it for those rows; a GPU without it times neither
    above = mma.TUNE_MAX_M + 1
    assert above <= wgmma.TUNE_MAX_M
    assert kernels.tiled_kernels(above, True) == ["cuda_wgmma", "cuda_dequant_cublas"]
    assert kernels.tiled_kernels(above, False) == []
    assert kernels.tiled_kernels(wgmma.TUNE_MAX_M + 1, True) == []
    assert kernels.tiled_kernels(mma.TUNE_MAX_M, False) == ["cuda_mma", "cuda_dequant_cublas"]


def test_explain_prints_each_layers_layout_and_kernel_with_every_candidates_answer() -> None:
    from conftest import trit

    out = trit("bench", "kernels", "--explain", "--models", "qwen2-1.5b", "--ms", "1,300", "--activations",
               "int8").stdout
    assert "int8 per token (W1.58A8)" in out
    blocks = out.split("\n\n")[1:]
    assert len(blocks) == len(kernels.SHAPES["qwen2-1.5b"])  # one a layer shape
    for block in blocks:
        assert "mma: cannot: the mma layout's kernels run on CUDA, not cpu\n  v1: chosen" in block
        assert "M=1: cpu_native" in block and "M=300: cpu_words" in block
        assert "cpu_native: can; the rule of thumb (no tuned choice) passes it over: M = 300 > 16" in block
        assert block.count("chosen (the rule of thumb)") == 2
    bad = trit("bench", "kernels", "--explain", "--models", "gpt5", check=False)
    assert bad.returncode == 2 and "no layer shapes for gpt5" in bad.stderr


def test_the_peers_are_checked_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    from trit.bench import peers

    assert peers.missing(("nope",)) == "no peer named nope; the peers are humming"
    assert peers.missing(("humming",)) == "--peers needs humming-kernels: pip install humming-kernels"


def test_trits_codes_become_hummings_uint2_codes_one_higher_in_the_same_bits() -> None:
    import torch

    from trit import format as fmt
    from trit.bench import peers

    g = torch.Generator().manual_seed(0)
    w = torch.randint(-1, 2, (5, 64), generator=g, dtype=torch.int8)
    words = peers.humming_weight(fmt.pack(w))  # (5, 4) int32: 16 codes a word, element i in bits 2i
    assert words.dtype == torch.int32 and words.shape == (5, 4)
    fields = (words.to(torch.int64)[..., None] >> (2 * torch.arange(16))) & 3
    assert torch.equal(fields.reshape(5, 64), w.to(torch.int64) + 2)
