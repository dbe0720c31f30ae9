"""The PTQ benchmark's ``--heal`` specs and the README table's names for its heal phases."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import ptq_smollm2  # noqa: E402
import tables  # noqa: E402


def _args(*heal: str):
    return ptq_smollm2.parse_args(["--variants", "bf16", *[a for h in heal for a in ("--heal", h)]])


def test_heal_spec_takes_a_first_phase() -> None:
    specs = ptq_smollm2.heal_specs(_args("base=gptq-g64-float-target,first=500,first_lr=2e-3,steps=400"))
    assert [(s["first"], s["first_lr"], s["steps"]) for s in specs] == [(500, 2e-3, 400)]
    assert ptq_smollm2.heal_specs(_args("steps=10"))[0]["first"] == 0


def test_heal_spec_samples_from_bos_unless_told() -> None:
    """The committed runs sampled from BOS alone: the script keeps that (trit heal's own default is random since)."""
    specs = ptq_smollm2.heal_specs(_args("data=teacher", "data=teacher,sample_first=random"))
    assert [s["sample_first"] for s in specs] == ["bos", "random"]


def test_table_names_both_phases_of_one_run() -> None:
    row = {"variant": "healed",
           "command": "trit quantize M O --method gptq --float-target; trit heal IN OUT --teacher MODEL --data CALIB "
                      "--steps 500 --lr 0.001 --batch 16 --seq-len 512 --train-samples 2048 --weight-lr 0.002 "
                      "--train-embeddings --scales-first 300 --scales-first-lr 0.003"}
    assert tables._ptq_name(row) == (
        "healed (gptq-g64-float-target; text data, batch 16x512, scales+norms+embeddings, lr 0.003, 300 steps -> "
        "text data, batch 16x512, all+embeddings, lr 0.001, weight lr 0.002, 500 steps)")


def test_the_front_page_is_short_and_its_tables_are_the_result_files() -> None:
    """README.md stays a front page (under 10 KB), and every marked table in it and in docs/ is what
    benchmarks/tables.py makes from the committed JSON now (no figure typed by hand, none stale); the results the
    package ships (trit demo's closing line) are made from the same files."""
    import json
    import re

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    assert len(readme.encode()) < 10 * 1024
    assert {"readme-quality", "readme-speed"} <= set(re.findall(r"<!-- table:([\w-]+) -->", readme))
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for m in tables._BLOCK.finditer(path.read_text()):
            if m.group(2) != "decode-plots":  # writes PNGs beside its table
                assert m.group(3) == tables.TABLES[m.group(2)]() + "\n", f"{path.name}: table {m.group(2)} is stale"
    shipped = json.loads((root / "src" / "trit" / "data" / "results.json").read_text())
    assert shipped == json.loads(json.dumps(tables.shipped_results()))
