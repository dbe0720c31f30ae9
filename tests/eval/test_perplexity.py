"""Perplexity: the window arithmetic, and the number against a direct computation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trit import runtime
from trit.eval.perplexity import PerplexityOptions, perplexity, tokenize_file, windows


def test_windows_score_each_token_once() -> None:
    for n, seq, stride, first in [(100, 16, 16, 0), (100, 16, 5, 0), (50, 8, 8, 7), (9, 16, 16, 0)]:
        spans = windows(n, PerplexityOptions(seq, stride, 0, first))
        scored = [t for _, end, frm in spans for t in range(frm, end)]
        assert scored == sorted(set(scored)) and scored[-1] == n - 1
        assert all(end - begin <= seq for begin, end, _ in spans)
        # a token goes unscored only where it opens a window with no context before it
        unscored = set(range(first, n)) - set(scored)
        assert unscored == {b for b, _, frm in spans if frm == b + 1}
        if stride < seq:
            assert unscored == {first}


def test_max_windows_and_bad_options() -> None:
    assert len(windows(10_000, PerplexityOptions(512, 512, 16))) == 16
    with pytest.raises(ValueError, match="stride"):  # a PerplexityError
        windows(100, PerplexityOptions(16, 32))


def test_matches_a_direct_computation(tiny_llama_trit: Path, tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 8)
    loaded = runtime.load(tiny_llama_trit, device="cpu")
    ids = tokenize_file(loaded, text)
    r = perplexity(loaded, ids, PerplexityOptions(seq_len=64, stride=64, max_windows=2), progress=False)
    assert r.windows == 2 and r.tokens_scored == 126 and r.last_token == 128  # 63 a window
    nll = []
    with torch.inference_mode():
        for begin in (0, 64):
            w = ids[begin : begin + 64][None]
            logp = torch.log_softmax(loaded.model(w).logits[0, :-1].float(), -1)
            nll.append(-logp.gather(1, w[0, 1:, None]).squeeze(1))
    direct = torch.cat(nll).mean().item()
    assert r.perplexity == pytest.approx(math.exp(direct), rel=1e-4)
