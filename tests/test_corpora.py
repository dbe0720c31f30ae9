"""The corpora shipped with trit: readable by name, split into evaluation and calibration halves that never meet."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trit import corpora


def test_builtin_corpora_read_by_name() -> None:
    for name in ("wikitext2", "gsm8k", "python"):
        label, text = corpora.read(name)
        assert label == name and len(text) > 100_000
    assert corpora.read("gsm8k")[1].startswith("Question: ")
    raw = (corpora.DATA / "wikitext-2-raw-test.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"


def test_halves_do_not_overlap() -> None:
    text = corpora.read("wikitext2")[1]
    evaluation, calibration = corpora.halves(text)
    assert evaluation + calibration == text and abs(len(evaluation) - len(calibration)) <= 1


def test_files_and_bad_names(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("hello")
    assert corpora.read(f) == ("t.txt", "hello")
    with pytest.raises(corpora.CorpusError, match="nope: no such text file, and not a built-in corpus"):
        corpora.read("nope")
