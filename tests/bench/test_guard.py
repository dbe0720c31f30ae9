"""The regression guard: the real tree passes its committed CPU baselines; planted regressions fail, named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trit.bench import guard
from trit.bench.guard import Figure, Report

BASELINES = Path(__file__).resolve().parents[2] / "benchmarks" / "baselines"


def _report(**figures: float) -> Report:
    return Report("memory", "cpu", {"torch": "1"}, {k: Figure(v, "bytes") for k, v in figures.items()})


def test_compare_flags_growth_beyond_the_tolerance_only() -> None:
    base = _report(a=100, b=100, c=100, gone=1)
    now = _report(a=104, b=106, c=80, new=5)
    verdicts = {r.name: r.verdict for r in guard.compare(now, base, 0.05)}
    assert verdicts == {"a": "ok", "b": "REGRESSED", "c": "better", "gone": "MISSING", "new": "new"}


def test_a_figure_may_carry_its_own_allowance() -> None:
    base = _report(rss=100)
    base.figures["rss"] = Figure(100, "MiB", spread=0.04, tolerance=0.12)
    assert guard.compare(_report(rss=110), base)[0].verdict == "ok"
    assert guard.compare(_report(rss=113), base)[0].verdict == "REGRESSED"


def test_other_versions_or_devices_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(_report(a=1).to_json())
    other = Report("memory", "cpu", {"torch": "2"}, {"a": Figure(1, "bytes")})
    with pytest.raises(guard.BaselineError, match=r"b.json: recorded with other versions \(torch 1 -> 2\)"):
        guard.check(other, path)
    with pytest.raises(guard.BaselineError, match="recorded for memory on cpu; this run is memory on gpu"):
        guard.check(Report("memory", "gpu", {"torch": "1"}), path)
    with pytest.raises(guard.BaselineError, match="no such baseline; write one with --write-baseline"):
        guard.check(other, tmp_path / "none.json")


def test_check_prints_the_table_and_fails_naming_the_figure(tmp_path: Path, capsys) -> None:
    path = tmp_path / "b.json"
    assert guard.check(_report(a=100), write=path) == 0
    assert guard.check(_report(a=120), path) == 1
    out = capsys.readouterr().out
    assert "a" in out and "+20.0%" in out and "REGRESSED" in out and "regression guard: FAIL: a" in out


@pytest.mark.timeout(1300)  # its own subprocess limit is 1200 s
def test_memory_figures_hold_their_baseline() -> None:
    """The real tree: checkpoints' bytes and bits, plan ledgers and quantize's peak RSS against the committed CPU
    baseline (exit status 0, every figure compared)."""
    proc = subprocess.run([sys.executable, "-m", "trit", "bench", "memory", "--baseline",
                           str(BASELINES / "memory_cpu.json")], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "regression guard: pass" in proc.stdout and "MISSING" not in proc.stdout


def test_a_larger_scale_dtype_is_caught(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A planted regression: float32 scales make every checkpoint larger; the guard names those figures."""
    import trit.convert
    from trit import format as fmt
    from trit.bench import memory
    from trit.configs import Layout

    real = trit.convert.convert
    monkeypatch.setattr(trit.convert, "convert",
                        lambda *a, **kw: real(*a, layout=Layout(scale_dtype=fmt.ScaleDtype.FLOAT32), **kw))
    baseline = guard.load(BASELINES / "memory_cpu.json")
    baseline.figures = {k: v for k, v in baseline.figures.items() if "smollm2" not in k}
    rows = guard.compare(memory.report(smollm2=False), baseline)
    bad = {r.name for r in rows if r.verdict == "REGRESSED"}
    assert "tiny llama absmean g32: bytes on disk" in bad and "tiny qwen2 absmean g64: bits a weight" in bad
    assert all(r.verdict == "ok" for r in rows if r.name.startswith("plan "))


@pytest.mark.timeout(1300)  # its own subprocess limit is 1200 s
def test_kernel_instructions_hold_their_baseline() -> None:
    pytest.importorskip("triton")
    proc = subprocess.run([sys.executable, "-m", "trit", "bench", "sass", "--baseline",
                           str(BASELINES / "sass_sm90.json")], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "regression guard: pass" in proc.stdout


def test_a_kernel_config_that_issues_more_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted regression: the GEMV at a config whose loop issues more instructions a word than the shipped one."""
    pytest.importorskip("triton")
    from trit.bench import sass

    monkeypatch.setattr(sass, "KERNELS", {"gemv": 1})
    monkeypatch.setattr(sass, "shipped_config", lambda kernel: [16, 64, 1, 4])
    baseline = guard.load(BASELINES / "sass_sm90.json")
    baseline.figures = {k: v for k, v in baseline.figures.items() if k.startswith("gemv ")}
    rows = {r.name: r for r in guard.compare(sass.report(), baseline)}
    assert rows["gemv M=1: loop instructions"].verdict == "REGRESSED", rows
