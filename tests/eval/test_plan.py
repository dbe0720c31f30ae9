"""``trit plan``: the memory ledger adds up, from headers or from a bare config, and says when it does not fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from trit.cli import main
from trit.eval.plan import GiB, PlanError, PlanOptions, parse_size, plan


def test_parse_size() -> None:
    assert parse_size("24GiB") == 24 * GiB and parse_size("80GB") == 80 * 10**9 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("1e9") == 10**9
    with pytest.raises(PlanError, match="expected a size such as 24GiB"):
        parse_size("lots")


def test_ledger_from_headers(tiny_llama_trit: Path) -> None:
    p = plan(tiny_llama_trit, PlanOptions(gpu_mem=GiB, max_seq_len=100, batch=3, overhead=0))
    with safe_open(str(tiny_llama_trit / "model.safetensors"), "pt") as f:
        ternary = sum(f.get_tensor(n).nbytes for n in f.keys() if n.endswith(("weight_packed", "weight_scale")))
    assert p.weights["ternary (codes, scales)"] == ternary
    cfg = json.loads((tiny_llama_trit / "config.json").read_text())
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert p.kv_per_token == kv and p.kv_total == kv * 300
    assert p.total == sum(p.weights.values()) + p.kv_total + p.activations
    assert p.fits and p.max_batch_fit * 100 * kv <= GiB - sum(p.weights.values()) - p.activations


def test_config_only_matches_the_stored_bytes(tiny_llama_trit: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_llama_trit / "config.json", tmp_path / "config.json")
    from_config = plan(tmp_path / "config.json", PlanOptions(group_size=32))
    from_headers = plan(tiny_llama_trit, PlanOptions())
    assert "computed from config.json" in from_config.source
    assert from_config.weights["ternary (codes, scales)"] == from_headers.weights["ternary (codes, scales)"]


@pytest.mark.parametrize("rotate", [True, False])
def test_a_float_config_plans_what_quantize_writes(tmp_path: Path, rotate: bool) -> None:
    """A tied float model's config plans the checkpoint ``trit quantize`` writes from it, with its default
    rotation (the lm_head a tensor of its own) and without (``--no-rotate``: still tied)."""
    from conftest import make_tiny_model, trit

    src = make_tiny_model(tmp_path / "src", tie=True, hidden=128, intermediate=256, heads=4, kv_heads=2)
    out = tmp_path / "out"
    trit("quantize", src, out, "--rotate" if rotate else "--no-rotate", "--group-size", "64", "--calib-samples", "2",
         "--calib-seq-len", "16", "--no-calib-cache", "--device", "cpu", "--quiet")
    shutil.copy(src / "config.json", tmp_path / "config.json")
    from_config = plan(tmp_path / "config.json", PlanOptions(rotate=rotate))
    from_headers = plan(out, PlanOptions())
    assert from_config.weights == from_headers.weights
    assert ("the tied lm_head written as its own tensor" in from_config.source) is rotate


def test_cli_says_when_it_does_not_fit(tiny_llama_trit: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", str(tiny_llama_trit), "--gpu-mem", "1MiB", "--overhead", "0"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["plan", str(tiny_llama_trit), "--gpu-mem", "4GiB", "--kv-cache-dtype", "fp8"]) == 0
    assert main(["plan", str(tiny_llama_trit), "--gpu-mem", "huge"]) == 2
    assert "expected a size such as 24GiB" in capsys.readouterr().err


def test_an_int8_head_is_planned_as_its_rows(tiny_llama_trit: Path, tmp_path: Path, monkeypatch) -> None:
    cfg = json.loads((tiny_llama_trit / "config.json").read_text())
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    shutil.copy(tiny_llama_trit / "config.json", tmp_path / "config.json")
    stored = plan(tmp_path / "config.json", PlanOptions(group_size=32))
    monkeypatch.setenv("TRIT_LM_HEAD", "int8")
    int8 = plan(tmp_path / "config.json", PlanOptions(group_size=32))
    tied = cfg.get("tie_word_embeddings", False)
    saved = 0 if tied else vocab * hidden * 2
    assert (int8.weights["embeddings and lm_head"] - stored.weights["embeddings and lm_head"]
            == vocab * hidden + 4 * vocab - saved)
    assert "lm_head in int8 rows" in int8.source and "int8" not in stored.source


def test_an_int8_head_from_the_headers_replaces_the_stored_bytes(tiny_llama_trit: Path, monkeypatch) -> None:
    with safe_open(str(tiny_llama_trit / "model.safetensors"), "pt") as f:
        head = f.get_tensor("lm_head.weight")  # the tiny model is untied
    stored = plan(tiny_llama_trit, PlanOptions())
    monkeypatch.setenv("TRIT_LM_HEAD", "int8")
    int8 = plan(tiny_llama_trit, PlanOptions())
    rows = head.shape[0] * head.shape[1] + 4 * head.shape[0]  # int8 codes and float32 scales
    # the stored matrix, at the dtype of its file, gives way to the rows
    assert int8.weights["embeddings and lm_head"] - stored.weights["embeddings and lm_head"] == rows - head.nbytes
    assert "lm_head in int8 rows" in int8.source and "int8" not in stored.source
