"""Evaluation text by name, shipped with the package: one corpus a domain, so that quality is read across domains.

``wikitext2`` (encyclopaedic prose), ``gsm8k`` (maths word problems with their
worked answers) and ``python`` (standard-library source code); any other name
is read as a text file. ``trit/data/README.md`` gives each file's source and
licence. A corpus is split once: the first ``EVAL_FRACTION`` of its characters
is the evaluation half (perplexity windows start there), the rest the
calibration half, so that ``--calib`` text drawn from a corpus by name never
overlaps what is scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trit.errors import TritError

DATA = Path(__file__).resolve().parent / "data"
EVAL_FRACTION = 0.5


class CorpusError(TritError, ValueError):
    """A corpus name that is neither built in nor a readable text file."""


@dataclass(frozen=True)
class Corpus:
    name: str
    file: str
    what: str

    def text(self) -> str:
        raw = (DATA / self.file).read_text(encoding="utf-8")
        if self.file.endswith(".jsonl"):  # GSM8K: each problem, then its worked answer, as plain text
            rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
            return "\n\n".join(f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows)
        return raw


BUILT_IN = {
    c.name: c for c in (
        Corpus("wikitext2", "wikitext-2-raw-test.txt", "WikiText-2 test, encyclopaedic prose"),
        Corpus("gsm8k", "gsm8k-test.jsonl", "GSM8K test, maths word problems with worked answers"),
        Corpus("python", "python-stdlib.txt", "Python standard-library source code"),
    )
}


def read(name_or_path: str | Path) -> tuple[str, str]:
    """``(label, text)`` of a built-in corpus or a text file."""
    if str(name_or_path) in BUILT_IN:
        corpus = BUILT_IN[str(name_or_path)]
        return corpus.name, corpus.text()
    path = Path(name_or_path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such text file, and not a built-in corpus ({', '.join(BUILT_IN)})")
    try:
        return path.name, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: unreadable as UTF-8 text ({e})") from None


def halves(text: str) -> tuple[str, str]:
    """``(evaluation, calibration)``: the first :data:`EVAL_FRACTION` of the characters, and the rest."""
    cut = int(len(text) * EVAL_FRACTION)
    return text[:cut], text[cut:]
