"""Perplexity over fixed windows of a text file, WikiText-2 style.

The whole file is tokenized once; windows of ``seq_len`` tokens start every
``stride`` tokens. Each token is scored once, in the first window that holds it
with context before it, so with ``stride < seq_len`` later windows score only
their last ``stride`` tokens (the sliding-window evaluation of the transformers
documentation's "Perplexity of fixed-length models"). The first token of the
first window has no context and is never scored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from trit.errors import TritError
from trit.runtime.loader import Loaded


class PerplexityError(TritError, ValueError):
    """Windows that cannot be laid over the text."""


@dataclass(frozen=True)
class PerplexityOptions:
    seq_len: int = 512
    stride: int = 0  # 0: seq_len, non-overlapping windows
    max_windows: int = 16  # 0: the whole file
    first_token: int = 0  # where the first window starts (calibration data may sit before it)


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token, nats
    tokens_scored: int
    windows: int
    first_token: int
    last_token: int  # one past the last token any window read
    seconds: float


def windows(n_tokens: int, opts: PerplexityOptions) -> list[tuple[int, int, int]]:
    """``(begin, end, score_from)`` of each window: tokens ``[score_from, end)`` are scored."""
    stride = opts.stride or opts.seq_len
    if opts.seq_len < 2 or not 0 < stride <= opts.seq_len:
        raise PerplexityError(f"need seq_len >= 2 and 0 < stride <= seq_len, got {opts.seq_len} and {stride}")
    out, prev_end = [], opts.first_token
    for begin in range(opts.first_token, max(n_tokens - 1, opts.first_token), stride):
        end = min(begin + opts.seq_len, n_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens or (opts.max_windows and len(out) == opts.max_windows):
            break
    return out


def tokenize_file(loaded: Loaded, path: str | Path) -> torch.Tensor:  # (T,) int64
    return tokenize_text(loaded, Path(path).read_text(encoding="utf-8"))


def tokenize_text(loaded: Loaded, text: str) -> torch.Tensor:  # (T,) int64
    return loaded.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]


def perplexities(loaded: Loaded, corpora: list[str], opts: PerplexityOptions = PerplexityOptions(),
                 progress: bool = True) -> dict[str, PerplexityResult]:
    """Perplexity on each corpus (a built-in name of :mod:`trit.eval.corpora`, or a text file), same windows."""
    from trit.corpora import read

    out = {}
    for name in corpora:
        label, text = read(name)
        out[label] = perplexity(loaded, tokenize_text(loaded, text), opts, progress)
    return out


def geometric_mean(values: list[float]) -> float:
    """The geometric mean: for perplexities, the exponential of the mean per-corpus loss."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def perplexity(
    loaded: Loaded, ids: torch.Tensor, opts: PerplexityOptions = PerplexityOptions(), progress: bool = True
) -> PerplexityResult:
    spans = windows(ids.numel(), opts)
    if not spans:
        raise PerplexityError(f"the text has {ids.numel()} tokens: too few to score from token {opts.first_token}")
    start, total_nll, scored = time.perf_counter(), 0.0, 0
    for begin, end, score_from in tqdm(spans, desc="perplexity", unit="window", disable=not progress):
        window = ids[begin:end].to(loaded.device)[None]  # (1, L)
        with torch.inference_mode():
            logits = loaded.model(window).logits[0, :-1].float()  # (L-1, V): position i predicts token i+1
        targets = window[0, 1:]
        keep = torch.arange(begin + 1, end, device=targets.device) >= score_from
        nll = torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
        total_nll += float(nll)
        scored += int(keep.sum())
    mean = total_nll / scored
    return PerplexityResult(math.exp(mean), mean, scored, len(spans), spans[0][0], spans[-1][1],
                            time.perf_counter() - start)
