"""``trit demo`` on the real SmolLM2: a full run is minutes on a CPU, so it is a slow test (``make test-slow``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(1900)  # its own subprocess limit is 1800 s
def test_demo_shows_a_ternary_model_within_twice_bf16() -> None:
    proc = subprocess.run([sys.executable, "-m", "trit", "demo", "--device", "cpu"], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1).strip(): float(m.group(3)) for m in
            re.finditer(r"^\s*(bf16|gptq, 2 planes|naive rounding)\s+([\d.e+]+)\s+([\d.e+]+)", proc.stdout, re.M)}
    assert set(rows) == {"bf16", "gptq, 2 planes", "naive rounding"} and "nan" not in proc.stdout
    assert rows["bf16"] == 1 and rows["gptq, 2 planes"] < 2 < rows["naive rounding"]


def test_the_heal_line_repeats_the_measured_recipe() -> None:
    """The demo's closing heal command is the committed best run's, with the flag that keeps its sampled sequences
    starting from BOS alone (they did; heal's default starts them from a random token since)."""
    from trit.cli import heal_config, parser
    from trit.demo import _heal_line

    command, measured = _heal_line().split("\n")
    assert command.endswith("--sample-first bos") and "perplexity 70.5" in measured
    opts = heal_config(parser().parse_args(["heal", *command.split()[2:]]))
    assert (opts.sample_first, opts.mix_sampled, opts.training_samples()) == ("bos", 2048, 2048)
