"""End to end: the performance monitor's files from a real 2-rank demo run."""

from __future__ import annotations

import json

import pytest

from .conftest import HEALTHY_RUN, HealthyRun, read_jsonl, read_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FLAGSCALE_ITERATION_KEYS = {
    "iteration",
    "timestamp",
    "TFLOPS_per_GPU",
    "TFLOPS_total",
    "samples_per_sec",
    "tokens_per_sec",
    "step_time_ms",
    "memory_GB",
    "peak_memory_GB",
}


@HEALTHY_RUN
def test_perf_files_from_a_demo_run_with_measured_flops(healthy_run: HealthyRun) -> None:
    """The shared healthy run (``conftest.healthy_run``): 20 steps, 8 samples per rank,
    FLOPs measured, a window every 5 iterations."""
    tmp_path, run_id, res, out = (
        healthy_run.log_dir,
        healthy_run.run_id,
        healthy_run.res,
        healthy_run.out,
    )
    assert res.returncode == 0, out
    assert out.count("[rankguard perf] iter") == 5  # iterations 1, 5, 10, 15, 20 (rank 0)

    perf_dir = tmp_path / "perf_monitor" / run_id
    entries = read_jsonl(perf_dir / "perf.jsonl")
    assert [e["iteration"] for e in entries] == [1, 5, 10, 15, 20]
    assert {e["rank"] for e in entries} == {0}
    for e in entries:
        assert set(e) >= FLAGSCALE_ITERATION_KEYS
        # global batch: 8 samples x 64 tokens on each of 2 ranks per step
        assert e["tokens_per_sec"] == pytest.approx(
            2 * 8 * 64 / (e["step_time_ms"] / 1e3), rel=0.01
        )
        assert e["TFLOPS_per_GPU"] > 0 and e["TFLOPS_total"] == pytest.approx(
            2 * e["TFLOPS_per_GPU"], rel=1e-3
        )
        assert e["MFU"] is None  # CPU: no peak unless perf.peak_tflops is given
        assert e["memory_kind"] == "cpu_rss" and e["memory_GB"] > 0

    (summary_path,) = perf_dir.glob("perf_summary_*.json")
    summary = json.loads(summary_path.read_text())
    assert set(summary) == {"session_info", "final_statistics", "iteration_logs"}
    info, stats = summary["session_info"], summary["final_statistics"]
    assert {"start_time", "end_time", "total_iterations"} <= set(info)
    assert info["total_iterations"] == 20 and info["flops_source"].startswith("measured")
    assert {
        "avg_tflops_per_gpu",
        "avg_tflops_total",
        "avg_step_time_ms",
        "min_step_time_ms",
        "max_step_time_ms",
        "peak_memory_gb",
    } <= set(stats)
    assert stats["min_step_time_ms"] <= stats["avg_step_time_ms"] <= stats["max_step_time_ms"]
    assert info["steps_in_statistics"] == 20 - 3  # warm-up left out

    run_dir = tmp_path / "heartbeat" / run_id
    cross = read_jsonl(run_dir / "perf_ranks.jsonl")
    assert cross and all(line["n_ranks"] == 2 for line in cross)
    assert all(set(line["by_rank"]) == {"0", "1"} for line in cross)
    assert read_status(run_dir)["perf"]["n_ranks"] == 2
