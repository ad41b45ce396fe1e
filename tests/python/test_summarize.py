"""bench/summarize.py judges the fused speed-up against issue 13's target of its direction:
forward >= 1.7x, backward >= 1.5x."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import summarize  # noqa: E402


def bench_json(tmp_path, times_ms):
    """A kernel_align_bench JSON with one median per case name: times in ms."""
    benchmarks = [{"name": f"{name}/real_time_median", "run_name": f"{name}/real_time",
                   "run_type": "aggregate", "aggregate_name": "median", "real_time": ms,
                   "cpu_time": ms, "time_unit": "ms"} for name, ms in times_ms.items()]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"context": {}, "benchmarks": benchmarks}))
    return str(path)


def fused_rows(tmp_path, fused_ms, unfused_ms):
    case = "{}/bf16/t2i_1024x1024/cpu-avx2/threads:1"
    times = {case.format(op): ms for op, ms in (
        ("qk_norm_rope_fwd", fused_ms), ("unfused_norm_rope_fwd", unfused_ms),
        ("qk_norm_rope_bwd", fused_ms), ("unfused_norm_rope_bwd", unfused_ms))}
    cases, _ = summarize.load([bench_json(tmp_path, times)])
    table = summarize.fused_table(cases, targets=True)
    return {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| fwd") or line.startswith("| bwd")}


def test_backward_is_judged_against_1_5_and_forward_against_1_7(tmp_path):
    rows = fused_rows(tmp_path, fused_ms=10.0, unfused_ms=16.0)  # 1.6x both ways
    assert rows["fwd"].endswith("| NOT met (>= 1.7x) |"), rows["fwd"]
    assert rows["bwd"].endswith("| met (>= 1.5x) |"), rows["bwd"]


def test_below_both_targets_is_not_met(tmp_path):
    rows = fused_rows(tmp_path, fused_ms=10.0, unfused_ms=14.0)  # 1.4x
    assert "NOT met" in rows["fwd"] and "NOT met" in rows["bwd"]


def memcpy_target_cells(tmp_path, dtype, threads, ratio):
    name = f"qk_rmsnorm_fwd/{dtype}/t2i_1024x1024/cpu-avx2/threads:{threads}"
    path = tmp_path / "ratio.json"
    path.write_text(json.dumps({"context": {}, "benchmarks": [{
        "name": name + "/real_time", "run_name": name + "/real_time", "run_type": "iteration",
        "real_time": 1.0, "cpu_time": 1.0, "time_unit": "ms", "ratio_to_copy": ratio}]}))
    cases, _ = summarize.load([str(path)])
    row = summarize.case_table(cases, targets=True).splitlines()[-1]
    return row.rsplit("|", 2)[1].strip()


def test_fp32_is_judged_against_issue_13s_0_9_at_one_thread_too(tmp_path):
    cell = memcpy_target_cells(tmp_path, "fp32", 1, 0.95)
    assert cell == "issue 3: NOT met (>= 1.00); issue 13: met (>= 0.90)", cell
    cell = memcpy_target_cells(tmp_path, "fp32", 2, 0.85)
    assert cell == "issue 3: NOT met (>= 0.90); issue 13: NOT met (>= 0.90)", cell


def test_bf16_has_only_issue_3s_memcpy_target(tmp_path):
    assert memcpy_target_cells(tmp_path, "bf16", 1, 1.05) == "issue 3: met (>= 1.00)"
