"""``trit demo`` on the real SmolLM2: a full run is minutes on a CPU, so it is a slow test (``make test-slow``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(1900)  # its own subprocess limit is 1800 s
def test_demo_shows_the_trade_and_one_plane_decoding_faster_than_bf16() -> None:
    proc = subprocess.run([sys.executable, "-m", "trit", "demo", "--device", "cpu"], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = ("bf16", "int4 (W4A8)", "ternary, 2 planes", "ternary, 1 plane", "naive rounding")
    pattern = r"^\s*(" + "|".join(re.escape(x) for x in labels) + r")\s+([\d.e+]+)\s+([\d.e+]+)\s+([\d.]+)\s+" \
        r"([\d.]+|16 \(bf16\))\s+([\d.]+)\s+([\d.]+)$"
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(pattern, proc.stdout, re.M)}
    assert set(rows) == set(labels) and "nan" not in proc.stdout, proc.stdout[-3000:]
    ppl = {name: float(r[1]) for name, r in rows.items()}  # x bf16
    assert ppl["bf16"] == 1 and ppl["int4 (W4A8)"] < 2 and ppl["ternary, 2 planes"] < 2.5 < ppl["naive rounding"]
    assert ppl["ternary, 1 plane"] < ppl["naive rounding"]
    assert float(rows["ternary, 1 plane"][5]) > 1  # its decode speed over bf16's, in the demo's own table


def test_the_heal_line_repeats_the_measured_recipe_from_the_packages_own_data() -> None:
    """The demo's closing heal command is the default recipe's measured run, read from the results the package ships
    (not from benchmarks/, which an installed wheel has none of); its flags parse as trit heal's."""
    import json

    import trit
    from trit.cli import heal_config, parser
    from trit.demo import RESULTS, heal_line

    assert RESULTS == Path(trit.__file__).parent / "data" / "results.json" and RESULTS.is_file()  # package data
    heal = json.loads(RESULTS.read_text())["heal"]
    command, measured = heal_line().split("\n")
    assert command == heal["command"] and f"x{heal['geometric_mean_ratio']:.2f}" in measured
    assert "x4.30" in measured and "H100" in measured and "quality_domains_h100_heal_defaults.json" in measured
    opts = heal_config(parser().parse_args(["heal", *command.split()[2:]]))
    assert (opts.sample_first, opts.training_samples(), opts.device) == ("random", 4096, "cuda")
