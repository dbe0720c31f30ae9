"""A profiler trace read back: where the GPU waited inside the largest prefill step, charged to the host ops."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from trit.bench import profile_trace

STEP = "execute_context_2(100)_generation_1(1)"


def _x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _trace() -> list[dict]:
    """One prefill step: trit::linear launches two kernels, aten::mm one; the GPU idles 10 us before each of the
    last two (a decode step and a smaller prefill beside it, which the summary passes over)."""
    return [
        _x("user_annotation", STEP, 900, 150),
        _x("cpu_op", "trit::linear", 905, 30),
        _x("cpu_op", "triton::launch", 926, 6),
        _x("cuda_driver", "cuLaunchKernelEx", 910, 2, correlation=1),
        _x("cuda_driver", "cuLaunchKernelEx", 930, 1, correlation=2),
        _x("cpu_op", "aten::mm", 950, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 955, 2, correlation=3),
        _x("gpu_user_annotation", STEP, 1000, 100, pid=0, tid=7),
        _x("kernel", "trit_wgmma_a8<...>", 1000, 10, pid=0, tid=7, correlation=1),
        _x("kernel", "_quantize_rows_mma", 1020, 20, pid=0, tid=7, correlation=2),
        _x("kernel", "nvjet_tst", 1050, 30, pid=0, tid=7, correlation=3),
        _x("gpu_user_annotation", "execute_context_0(0)_generation_16(16)", 2000, 50, pid=0, tid=7),
        _x("gpu_user_annotation", "execute_context_1(16)_generation_0(0)", 3000, 500, pid=0, tid=7),
        {"ph": "i", "name": "an instant event, not counted", "ts": 1010},
    ]


def test_the_idle_time_is_charged_to_the_op_that_launched_the_kernel_after_it(tmp_path: Path) -> None:
    path = tmp_path / "worker.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _trace()}, f)
    s = profile_trace.step_gaps(profile_trace.load(path))
    assert (s["step"], s["context_tokens"], s["span_us"]) == (STEP, 100, 100)
    assert s["kernel_us"] == pytest.approx(60) and s["idle_us"] == pytest.approx(20)
    # the second kernel was launched inside trit::linear's Triton launch; the third inside aten::mm
    assert s["idle_by_launching_op_us"] == {"triton::launch": pytest.approx(10), "aten::mm": pytest.approx(10)}
    assert s["idle_by_op_chain_us"]["trit::linear > triton::launch"] == pytest.approx(10)
    assert s["host_step_us"] == 150
    assert s["host_ops_us"]["trit::linear"] == {"us": pytest.approx(30), "calls": 1}


def test_a_trace_without_a_prefill_step_has_no_summary() -> None:
    events = [e for e in _trace() if e.get("name") != STEP]
    events = [e for e in events if not e.get("name", "").startswith("execute_context_1(")]
    assert profile_trace.step_gaps(events) is None


def test_gaps_under_the_threshold_are_not_counted() -> None:
    s = profile_trace.step_gaps(_trace(), min_gap_us=11)
    assert s["idle_us"] == 0 and s["idle_by_launching_op_us"] == {}
