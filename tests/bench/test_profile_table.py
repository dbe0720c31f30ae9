"""The torch profiler's summary table read back: a real one from this CPU, and one in the layout a GPU run writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trit.bench import profile_table

HEAD = ("Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA", "Self CUDA %",
        "CUDA total", "CUDA time avg", "# of Calls")
# rows of a CUDA profile (figures made up, each a sum one can check): name, self CPU, self CUDA, calls
GPU_ROWS = (("void trit_gemv<1, 2, 64>(U4 const*, unsigned int con...", "0.000us", "1.100ms", 128),
            ("_gemv_kernel", "0.000us", "200.000us", 32),
            ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "0.000us", "240.000us", 1),
            ("void cutlass::device_kernel<flash::enable_sm90_or_la...", "0.000us", "410.000us", 32),
            ("aten::linear", "30.000us", "0.000us", 32),
            ("triton_poi_fused_add_mul_0", "0.000us", "150.000us", 64),
            # a CPU op: its device column repeats the kernel it launched (nvjet above)
            ("aten::mm", "31.000us", "240.000us", 1),
            # vLLM's step annotations: spans on the GPU (two decode steps, one prefill), and the CPU's range
            ("execute_context_0(0)_generation_1(1)", "0.000us", "1.300ms", 2),
            ("execute_context_1(16)_generation_0(0)", "0.000us", "500.000us", 1),
            ("execute_context_1(16)_generation_0(0)", "20.000us", "0.000us", 1))


def _gpu_table() -> str:
    """A table in the layout torch writes for a CUDA profile: a 55-character name column, 12-character figures."""
    widths = (55, *[12] * (len(HEAD) - 1))

    def line(cells) -> str:
        return "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)) + "  "

    rule = "  ".join("-" * w for w in widths) + "  "
    body = [line((n, "0.00%", cpu, "0.00%", cpu, cpu, cuda, "0.00%", cuda, cuda, str(calls)))
            for n, cpu, cuda, calls in GPU_ROWS]
    return "\n".join([rule, line(HEAD), rule, *body, rule, "Self CPU time total: 3.000ms",
                      "Self CUDA time total: 2.200ms", ""])


def test_a_gpu_table_reads_back_and_sums_by_group() -> None:
    t = profile_table.parse(_gpu_table())
    assert t["self_cpu_total_us"] == pytest.approx(3000) and t["self_device_total_us"] == pytest.approx(2200)
    names = [r["name"] for r in t["rows"]]
    assert names[0].startswith("void trit_gemv<1, 2, 64>") and "aten::linear" in names and len(names) == 10
    gemv = t["rows"][0]
    assert (gemv["self_device_us"], gemv["calls"]) == (pytest.approx(1100), 128)
    assert t["rows"][4]["self_cpu_us"] == pytest.approx(30) and t["rows"][4]["self_device_us"] == 0

    s = profile_table.summarize(t, steps=2, top=3)
    assert s["clock"] == "device" and s["us_per_step"] == pytest.approx(1100)
    by = s["us_per_step_by_group"]
    assert by["trit"] == pytest.approx(650) and by["gemm"] == pytest.approx(120)
    assert by["attention"] == pytest.approx(205) and by["other"] == pytest.approx(75)
    assert by["not listed"] == pytest.approx(50)  # 2200 in all, 2100 in the kernels' rows
    assert [r["calls"] for r in s["top"]] == [128, 32, 1]  # kernels by device time: no CPU op, no annotation
    assert (s["decode_steps"], s["decode_step_span_us"]) == (2, pytest.approx(650))  # the prefill's span apart
    assert s["prefill_step_spans"] == [{"step": "execute_context_1(16)_generation_0(0)", "context_tokens": 16,
                                        "span_us": pytest.approx(500), "calls": 1}]
    # the linear layers' CPU ops and their host time (CPU total), not the kernels'
    assert s["linear_ops_cpu"] == {"aten::linear": {"cpu_total_us": pytest.approx(30), "calls": 32},
                                   "aten::mm": {"cpu_total_us": pytest.approx(31), "calls": 1}}


def test_a_cpu_table_from_the_profiler_itself() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a = torch.randn(32, 32)
        for _ in range(3):
            torch.relu(torch.nn.functional.linear(a, a))
    events = prof.key_averages()
    t = profile_table.parse(events.table(sort_by="self_cpu_time_total", row_limit=50))
    assert t["self_device_total_us"] is None and t["self_cpu_total_us"] > 0
    rows = {r["name"]: r for r in t["rows"]}
    assert rows["aten::relu"]["calls"] == 3 and rows["aten::linear"]["calls"] == 3
    assert all(r["self_device_us"] is None for r in t["rows"])
    assert sum(r["self_cpu_us"] for r in t["rows"]) == pytest.approx(t["self_cpu_total_us"], rel=0.02)
    s = profile_table.summarize(t, steps=3)
    assert s["clock"] == "cpu" and s["us_per_step"] == pytest.approx(t["self_cpu_total_us"] / 3)


@pytest.mark.parametrize(("name", "group"), [("void trit_wgmma<128, 1, 1, 64, 4, 8>(...)", "trit"),
                                             ("trit::linear", "trit"),  # the op itself: the CPU's kernels run in it
                                             ("_skinny_kernel", "trit"), ("sm90_xmma_gemm_bf16bf16", "gemm"),
                                             ("void flash_fwd_kernel<...>", "attention"),
                                             ("void cutlass::device_kernel<flash::enable_sm90_or_la...", "attention"),
                                             ("triton_red_fused_rms_norm_0", "other")])
def test_kernels_go_to_their_group(name: str, group: str) -> None:
    assert profile_table.group(name) == group


def test_text_that_is_no_table_is_refused() -> None:
    with pytest.raises(ValueError, match="not a torch profiler table"):
        profile_table.parse("Self CPU time total: 1.0ms\n")


REAL = Path(__file__).parents[2] / "benchmarks" / "results" / "serve-profile"


@pytest.mark.parametrize("table", sorted(REAL.glob("*.profile.txt")), ids=lambda p: p.name)
def test_a_real_h200_table_adds_up(table: Path) -> None:
    """vLLM 0.25.1's worker table from the H200: the kernels alone make the table's total, and a decode step's
    span on the GPU holds at least its share of them."""
    t = profile_table.parse(table.read_text())
    s = profile_table.summarize(t, steps=256)
    assert s["clock"] == "device" and "not listed" not in s["us_per_step_by_group"]
    assert sum(s["us_per_step_by_group"].values()) == pytest.approx(t["self_device_total_us"] / 256, rel=1e-3)
    assert s["us_per_step_by_group"]["attention"] > 0 and s["decode_steps"] >= 254
    assert all(not r["name"].startswith(("aten::", "cuda", "execute_context")) for r in s["top"])
