"""A summary rank 0 did not close is completed from perf.jsonl by the launcher."""

from __future__ import annotations

import json
from pathlib import Path

from rankguard.perf.finish import (
    STATISTICS_FROM_WINDOWS,
    add_ettr,
    complete_summary,
    last_attempt,
)


def _window(step: int, n: int, ms: float, **extra: object) -> dict[str, object]:
    return {
        "iteration": step - 1,
        "step": step,
        "steps_in_window": n,
        "step_time_ms": ms,
        "gpu_step_time_ms": None,
        "samples_per_sec": 8000 / ms,
        "peak_memory_GB": 0.5,
        "timestamp": f"t{step}",
        **extra,
    }


def _run(tmp_path: Path, windows: list[dict[str, object]], total: int) -> Path:
    with open(tmp_path / "perf.jsonl", "w") as fh:
        for w in windows:
            fh.write(json.dumps(w) + "\n")
        fh.write('not json\n{"step": "x"}\n')  # what a killed writer or a user left
    summary = {
        "session_info": {
            "total_iterations": total,
            "world_size": 2,
            "warmup_iterations": 2,
            "flops_per_step": 4e12,
            "peak_tflops_per_gpu": 100.0,
        },
        "final_statistics": {"avg_step_time_ms": 900.0},
        "iteration_logs": windows[:1],
    }
    path = tmp_path / "perf_summary_20261205_000000.json"
    path.write_text(json.dumps(summary))
    return path


def test_a_stopped_runs_summary_covers_every_step_of_perf_jsonl(tmp_path: Path) -> None:
    windows = [_window(1, 1, 900.0, includes_startup=True)]
    windows += [_window(s, 9 if s == 10 else 10, 20.0) for s in range(10, 320, 10)]
    path = _run(tmp_path, windows, total=1)
    assert complete_summary(tmp_path) == path
    out = json.loads(path.read_text())
    info, stats = out["session_info"], out["final_statistics"]
    assert info["total_iterations"] == 310
    assert info["steps_in_statistics"] == 309  # the start-up window left out
    assert info["statistics_source"] == STATISTICS_FROM_WINDOWS
    assert stats["avg_step_time_ms"] == 20.0 and stats["max_step_time_ms"] == 20.0
    assert stats["avg_tflops_per_gpu"] == 100.0  # 4e12 / 0.02 s / 2 GPUs
    assert stats["avg_mfu"] == 1.0 and stats["avg_samples_per_sec"] == 400.0
    assert len(out["iteration_logs"]) == len(windows)
    assert complete_summary(tmp_path) is None  # complete now: left as it is


def test_a_closed_summary_is_left_alone(tmp_path: Path) -> None:
    windows = [_window(s, 10, 20.0) for s in range(10, 40, 10)]
    path = _run(tmp_path, windows, total=35)  # rank 0 closed it after its last window
    before = path.read_text()
    assert complete_summary(tmp_path) is None and path.read_text() == before


def test_only_the_last_attempt_counts(tmp_path: Path) -> None:
    first = [_window(s, 10, 50.0) for s in range(10, 60, 10)]
    second = [_window(s, 10, 20.0) for s in range(10, 40, 10)]
    _run(tmp_path, first + second, total=1)
    assert [w["step"] for w in last_attempt(tmp_path / "perf.jsonl")] == [10, 20, 30]


def test_the_launcher_adds_the_jobs_ettr_to_the_final_statistics(tmp_path: Path) -> None:
    windows = [_window(s, 10, 20.0) for s in range(10, 40, 10)]
    path = _run(tmp_path, windows, total=1)
    assert complete_summary(tmp_path) == path
    assert json.loads(path.read_text())["final_statistics"]["ettr"] is None
    assert add_ettr(tmp_path, 0.912) == path
    out = json.loads(path.read_text())
    assert out["final_statistics"]["ettr"] == 0.912
    assert out["final_statistics"]["avg_step_time_ms"] == 20.0  # the rest as it was
    assert add_ettr(tmp_path, None) is None and add_ettr(tmp_path, float("nan")) is None
    path.write_text(json.dumps({"session_info": {}}))  # no statistics: nothing to add to
    assert add_ettr(tmp_path, 0.5) is None
    assert add_ettr(tmp_path / "none", 0.5) is None
