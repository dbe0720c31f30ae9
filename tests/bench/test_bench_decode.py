"""``trit bench decode`` end to end on a CPU with the tiny shape: the driver, the runtime engine, the JSON."""

from __future__ import annotations

import json

from trit.bench import decode


def test_runtime_engine_writes_every_run(tmp_path) -> None:
    out = tmp_path / "decode.json"
    rc = decode.main(["--engines", "runtime", "--models", "tiny", "--batches", "1,2", "--prompt", "12",
                      "--new-tokens", "6", "--device", "cpu", "--context", "tiny:40", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("trit bench decode --engines runtime")
    workers = result["workers"]
    assert [(w["model"], w["weights"], w["error"]) for w in workers] == [
        ("tiny", "bf16", None), ("tiny", "trit", None), ("tiny", "trit", None)]
    runs = [r for w in workers for r in w["runs"]]
    assert [(r["weights"], r["batch"], r["max_len"]) for r in runs] == [
        ("bf16", 1, 18), ("bf16", 2, 18), ("trit", 1, 18), ("trit", 2, 18), ("trit", 1, 40)]
    for r in runs:
        assert r["prompt"] + r["new_tokens"] == r["max_len"]
        assert r["ttft_ms"] > 0 and 0 < r["tpot_p50_ms"] <= r["tpot_p99_ms"]
        assert r["tokens_per_s"] > 0 and r["peak_bytes"] is None and not r["graphs"]  # a CPU: no graphs


def test_a_failing_worker_is_reported_not_fatal(tmp_path) -> None:
    out = tmp_path / "decode.json"
    rc = decode.main(["--engines", "runtime", "--models", "tiny", "--weights", "trit", "--batches", "1",
                      "--prompt", "30", "--new-tokens", "4", "--max-len", "16", "--device", "cpu", "--out", str(out)])
    assert rc == 1
    (worker,) = json.loads(out.read_text())["workers"]
    assert "expected 1 rows shorter than 16" in worker["error"]


def test_plan_for_counts_the_ternary_model() -> None:
    small = decode.plan_for("tiny", batch=1, max_len=64, prefill_rows=32)
    assert decode.plan_for("tiny", batch=4, max_len=64, prefill_rows=128) > small > 0


def test_percentile_and_shapes() -> None:
    assert decode.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert decode.percentile([float(i) for i in range(1, 101)], 99) == 99.0
    cfg = decode.hf_config("27b")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (5376, 62, 128)


def test_a_folder_as_out_is_refused_before_any_worker_runs(tmp_path, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as e:
        decode.main(["--engines", "runtime", "--models", "tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert f"--out {tmp_path} is a folder; give the JSON file to write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
