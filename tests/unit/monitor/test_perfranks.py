"""PerfRanks (cross-rank step times from heartbeat windows) and its use by JobMonitor."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.monitor.config import HeartbeatConfig
from rankguard.monitor.monitor import JobMonitor
from rankguard.monitor.perfranks import PERF_RANKS_FILE, PerfRanks
from rankguard.schema.blocks import PerfBlock
from tests.factories import FakeClock, heartbeat_record
from tests.factories import write_heartbeats as _write

RUN = "run-pr"
LINE_KEYS = {
    "schema_version",
    "run_id",
    "step",
    "iteration",
    "n_ranks",
    "world_size",
    "step_time_ms",
    "slowest_rank",
    "fastest_rank",
    "by_rank",
}


_rec = partial(
    heartbeat_record,
    run_id=RUN,
    seq_step_ns=1,
    hostname="node-a",
    pid_base=5000,
    progress_lead=1,
    since=0.1,
    gpu_token=None,
    publisher_fields=True,
)


def windows(*items: tuple[int, int | None, float | None]) -> PerfBlock:
    return PerfBlock.from_dict({"windows": [list(w) for w in items]})


def _add(pr: PerfRanks, rank: int, perf: Any) -> None:
    """A heartbeat's raw ``perf`` field as the monitor reads it (not an object: none)."""
    try:
        block = PerfBlock.from_dict(perf)
    except ValueError:
        return
    pr.add(rank, block)


# ---- PerfRanks ----------------------------------------------------------------------


def test_line_only_once_every_rank_reported_the_window() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((10, 10, 100.0)))
    pr.add(1, windows((10, 10, 110.0)))
    assert pr.complete(3, {0: 10, 1: 10}) == []  # rank 2 not yet
    assert pr.latest is None
    pr.add(2, windows((10, 10, 130.0)))
    (line,) = pr.complete(3, {0: 10, 1: 10, 2: 10})
    assert set(line) == LINE_KEYS
    assert line["schema_version"] == 1 and line["run_id"] == RUN
    assert line["step"] == 10 and line["iteration"] == 10
    assert line["n_ranks"] == 3 and line["world_size"] == 3
    assert line["step_time_ms"] == {"min": 100.0, "median": 110.0, "max": 130.0}
    assert line["slowest_rank"] == 2 and line["fastest_rank"] == 0
    assert line["by_rank"] == {"0": 100.0, "1": 110.0, "2": 130.0}
    assert pr.latest == line


def test_statistics_over_ranks() -> None:
    pr = PerfRanks(RUN)
    values = {0: 52.0, 1: 50.0, 2: 75.5, 3: 49.25}
    for rank, ms in values.items():
        pr.add(rank, windows((5, 105, ms)))
    (line,) = pr.complete(4, dict.fromkeys(values, 5))
    assert line["step_time_ms"] == {"min": 49.25, "median": 51.0, "max": 75.5}
    assert line["slowest_rank"] == 2 and line["fastest_rank"] == 3
    assert line["iteration"] == 105
    assert list(line["by_rank"]) == ["0", "1", "2", "3"]
    assert line["by_rank"]["2"] == 75.5


def test_values_are_rounded_to_microseconds() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((1, 1, 1.23456789)))
    (line,) = pr.complete(1, {0: 1})
    assert line["step_time_ms"]["min"] == 1.235 and line["by_rank"] == {"0": 1.235}


def test_partial_window_once_every_rank_moved_past_it() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((10, 10, 100.0), (20, 20, 101.0)))
    pr.add(1, windows((20, 20, 99.0)))  # rank 1's window 10 never arrived
    # Both ranks are past window 10: nobody can still report it, so it goes out partial.
    lines = pr.complete(2, {0: 20, 1: 20})
    assert [(x["step"], x["n_ranks"]) for x in lines] == [(10, 1), (20, 2)]
    assert lines[0]["by_rank"] == {"0": 100.0}
    assert lines[0]["world_size"] == 2
    assert pr.latest == lines[-1]


def test_partial_window_waits_while_a_rank_can_still_report_it() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((10, 10, 100.0), (20, 20, 100.0)))
    assert pr.complete(2, {0: 20, 1: 10}) == []  # rank 1 is at window 10: may report it
    assert pr.complete(2, {}) == []  # what the monitor passes until every rank reported
    pr.add(1, windows((10, 10, 120.0)))
    (line,) = pr.complete(2, {0: 20, 1: 10})
    assert line["step"] == 10 and line["n_ranks"] == 2


def test_no_duplicate_lines() -> None:
    pr = PerfRanks(RUN)
    for _ in range(3):  # heartbeats repeat the last windows: added again every scan
        pr.add(0, windows((10, 10, 100.0), (20, 20, 100.0)))
        pr.add(1, windows((10, 10, 100.0), (20, 20, 100.0)))
    first = pr.complete(2, {0: 20, 1: 20})
    assert [x["step"] for x in first] == [10, 20]
    for _ in range(3):
        pr.add(0, windows((10, 10, 100.0), (20, 20, 100.0)))
        pr.add(1, windows((10, 10, 100.0), (20, 20, 100.0), (30, 30, 90.0)))
        assert pr.complete(2, {0: 20, 1: 30}) == []
    pr.add(0, windows((20, 20, 100.0), (30, 30, 95.0)))
    assert [x["step"] for x in pr.complete(2, {0: 30, 1: 30})] == [30]
    assert pr.complete(2, {0: 30, 1: 30}) == []


def test_a_later_report_of_a_rank_replaces_its_value() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((10, 10, 100.0)))
    pr.add(0, windows((10, 10, 105.0)))
    pr.add(1, windows((10, 10, 100.0)))
    (line,) = pr.complete(2, {0: 10, 1: 10})
    assert line["by_rank"] == {"0": 105.0, "1": 100.0}


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        "windows",
        [5],  # not a list
        [[]],  # empty
        [[10]],  # no value
        [["ten", 10, 1.0]],  # step not a number
        [[None, 10, 1.0]],
        [[10, 10, None]],  # no step time
    ],
)
def test_malformed_windows_are_ignored(bad: Any) -> None:
    pr = PerfRanks(RUN)
    _add(pr, 0, {"windows": bad})
    pr.add(0, windows((20, 20, 50.0)))
    (line,) = pr.complete(1, {0: 20})
    assert line["step"] == 20 and line["by_rank"] == {"0": 50.0}


@pytest.mark.parametrize(
    "perf",
    [
        pytest.param({"windows": [[10, 10, "slow"]]}, id="ms-string"),
        pytest.param({"windows": [[10, "ten", 1.0]]}, id="iteration-string"),
        pytest.param({"windows": [{"step": 10}]}, id="window-dict"),
        pytest.param("not a dict", id="perf-string"),
    ],
)
def test_malformed_values_are_ignored(perf: Any) -> None:
    pr = PerfRanks(RUN)
    _add(pr, 0, perf)
    pr.add(0, windows((20, 20, 50.0)))
    (line,) = pr.complete(1, {0: 20})
    assert line["by_rank"] == {"0": 50.0}


def test_non_finite_step_times_are_ignored() -> None:
    pr = PerfRanks(RUN)
    pr.add(0, windows((10, 10, math.nan), (20, 20, math.inf), (30, 30, 5.0)))
    lines = pr.complete(1, {0: 30})
    assert [x["step"] for x in lines] == [30]


# ---- JobMonitor ---------------------------------------------------------------------


def _perf(step: int, ms: float, wins: list[list[Any]]) -> dict[str, Any]:
    return {
        "step": step,
        "iteration": step,
        "step_time_ms": ms,
        "TFLOPS_per_GPU": 1.5,
        "memory_GB": 2.0,
        "windows": wins,
    }


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / PERF_RANKS_FILE
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_monitor_writes_perf_ranks_and_status(tmp_path: Path) -> None:
    cfg = HeartbeatConfig(publish_interval_s=1.0, scan_interval_s=0.1)
    mon = JobMonitor(cfg, tmp_path, RUN, expected_world_size=2, clock=FakeClock(), check_pids=False)
    _write(tmp_path, _rec(0, 0, perf=_perf(10, 100.0, [[1, 1, 120.0], [10, 10, 100.0]])))
    mon.scan_once()
    assert _lines(tmp_path) == []  # rank 1 has not reported: no line, no partial line
    assert mon.status["perf"] is None
    row0 = mon.status["ranks"][0]["perf"]
    assert row0 == {
        "step": 10,
        "iteration": 10,
        "step_time_ms": 100.0,
        "TFLOPS_per_GPU": 1.5,
        "memory_GB": 2.0,
    }  # the windows stay out of status.json
    _write(tmp_path, _rec(1, 0, perf=_perf(10, 140.0, [[1, 1, 130.0], [10, 10, 140.0]])))
    mon.scan_once()
    lines = _lines(tmp_path)
    assert [(x["step"], x["n_ranks"]) for x in lines] == [(1, 2), (10, 2)]
    assert lines[1]["step_time_ms"] == {"min": 100.0, "median": 120.0, "max": 140.0}
    assert lines[1]["slowest_rank"] == 1 and lines[1]["fastest_rank"] == 0
    assert lines[1]["by_rank"] == {"0": 100.0, "1": 140.0}
    assert mon.status["perf"] == {
        "step": 10,
        "iteration": 10,
        "step_time_ms": {"min": 100.0, "median": 120.0, "max": 140.0},
        "slowest_rank": 1,
        "n_ranks": 2,
    }
    assert json.loads((tmp_path / "status.json").read_text())["perf"] == mon.status["perf"]
    # Further scans of the same records add nothing.
    mon.scan_once()
    mon.scan_once()
    assert len(_lines(tmp_path)) == 2
    # Rank 0 runs ahead: window 20 waits for rank 1, then a line for it alone.
    _write(tmp_path, _rec(0, 1, perf=_perf(20, 90.0, [[10, 10, 100.0], [20, 20, 90.0]])))
    mon.scan_once()
    assert len(_lines(tmp_path)) == 2
    _write(tmp_path, _rec(1, 1, perf=_perf(30, 95.0, [[30, 30, 95.0]])))  # its 20 was lost
    _write(tmp_path, _rec(0, 2, perf=_perf(30, 91.0, [[20, 20, 90.0], [30, 30, 91.0]])))
    mon.scan_once()
    lines = _lines(tmp_path)
    assert [(x["step"], x["n_ranks"]) for x in lines[2:]] == [(20, 1), (30, 2)]
    assert mon.status["perf"]["step"] == 30
    assert mon.scan_errors == 0


def test_monitor_without_perf_fields_writes_no_perf_ranks(tmp_path: Path) -> None:
    cfg = HeartbeatConfig(publish_interval_s=1.0, scan_interval_s=0.1)
    mon = JobMonitor(cfg, tmp_path, RUN, expected_world_size=2, clock=FakeClock(), check_pids=False)
    _write(tmp_path, _rec(0, 0, perf=None))
    _write(tmp_path, _rec(1, 0, perf=None))
    mon.scan_once()
    assert not (tmp_path / PERF_RANKS_FILE).exists()
    assert mon.status["perf"] is None
    assert [r["perf"] for r in mon.status["ranks"]] == [None, None]


def test_a_malformed_perf_value_does_not_lose_findings(tmp_path: Path) -> None:
    cfg = HeartbeatConfig(
        publish_interval_s=1.0, process_timeout_s=10.0, initial_process_timeout_s=10.0
    )
    clock = FakeClock()
    mon = JobMonitor(cfg, tmp_path, RUN, expected_world_size=2, clock=clock, check_pids=False)
    bad = _perf(10, 100.0, [[10, 10, "slow"]])
    _write(tmp_path, _rec(0, 0, perf=bad))
    _write(tmp_path, _rec(1, 0, perf=None))
    mon.scan_once()
    for seq in range(1, 13):  # rank 1 goes silent
        clock.t += 1
        _write(tmp_path, _rec(0, seq, perf=bad))
        mon.scan_once()
    _write(tmp_path, _rec(0, 13, perf=_perf(20, 100.0, [[20, 20, 100.0]])))  # valid again
    mon.scan_once()
    findings = tmp_path / "findings.jsonl"
    assert findings.exists(), f"no findings file; scan errors: {mon.scan_errors}"
    assert [json.loads(x)["rank"] for x in findings.read_text().splitlines()] == [1]
    assert mon.scan_errors == 0


def test_cross_rank_lines_resume_after_the_ranks_restart(tmp_path: Path) -> None:
    cfg = HeartbeatConfig(publish_interval_s=1.0, scan_interval_s=0.1)
    clock = FakeClock()
    mon = JobMonitor(cfg, tmp_path, RUN, expected_world_size=2, clock=clock, check_pids=False)
    for rank in (0, 1):
        _write(tmp_path, _rec(rank, 0, perf=_perf(30, 100.0, [[20, 20, 100.0], [30, 30, 100.0]])))
    mon.scan_once()
    assert [x["step"] for x in _lines(tmp_path)] == [20, 30]
    clock.t += 1
    for rank in (0, 1):  # restarted: new pids, steps from 1 again
        r = _rec(rank, 0, perf=_perf(10, 80.0, [[1, 1, 90.0], [10, 10, 80.0]]))
        r["pid"] = 6000 + rank
        r["wall_time_ns"] += 10**12
        _write(tmp_path, r)
    mon.scan_once()
    assert [r["pid"] for r in mon.status["ranks"]] == [6000, 6001]
    assert [x["step"] for x in _lines(tmp_path)] == [20, 30, 1, 10]
    assert mon.status["perf"]["step"] == 10
