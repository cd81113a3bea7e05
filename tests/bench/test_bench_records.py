"""The benches that simulate ranks write what real ranks write: every simulated record
passes the checks the relay and the monitor apply to a real one
(:meth:`~rankguard.schema.records.HeartbeatRecord.from_dict`), at every virtual time a
bench run reaches: the start (a rank's lag reaching before the job began), steady
steps, and both injected hangs. A rejected record is skipped by the monitor, so a bench
feeding them measures a job that no real rank makes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rankguard.schema.records import HeartbeatRecord

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("interval", [0.5, 1.0, 5.0])
def test_every_record_of_the_scale_bench_is_accepted(interval: float) -> None:
    scale = _load("scale")
    world = 64
    # process hang of rank 9 at 3 s, collective hang at 4 s with rank 5 the culprit
    clock = scale.Clock(0.5, [3.0, 4.0, 5, 9], 1000.0)
    ranks = [scale.SimRank(r, world, interval) for r in range(world)]
    times = [0.0, 0.1, 0.3, 0.7, 1.0, 2.5, 3.2, 4.0, 4.6, 7.3, 30.0]
    checked = 0
    for sim in ranks:
        for t in times:
            raw = sim.record(clock, t)
            rec = HeartbeatRecord.from_dict(json.loads(json.dumps(raw)))
            assert rec.progress_seq >= 0 and (rec.since_progress_s or 0.0) >= 0.0
            checked += 1
    assert checked == world * len(times)


def test_every_record_of_the_monitor_scan_bench_is_accepted(tmp_path: Path) -> None:
    monitor_scan = _load("monitor_scan")
    rank = monitor_scan.FakeRank(tmp_path, 3, 16)
    lines = [rank.record("process_start")] + [rank.record("heartbeat") for _ in range(5)]
    for line in lines:
        HeartbeatRecord.from_dict(json.loads(line))


def test_the_scale_bench_records_are_apart_by_virtual_time_not_real_time() -> None:
    """A slow lockstep run takes longer in real time than the virtual time it simulates:
    a rank's records must still be one publish interval apart on their own clock. Apart
    by the real time between them, records further apart than the monitor's fresh
    period read as a rank paused and resumed (its progress clock restarts), and a
    collective hang was never found."""
    import time

    scale = _load("scale")
    clock = scale.Clock(2.0, [0.0, 0.0, 0.0, 0.0], time.monotonic())
    sim = scale.SimRank(3, 16, 5.0)
    first = HeartbeatRecord.from_dict(sim.record(clock, 20.0))
    time.sleep(0.3)  # the machine simulates slowly
    second = HeartbeatRecord.from_dict(sim.record(clock, 21.0))
    assert first.monotonic_ns is not None and second.monotonic_ns is not None
    assert second.monotonic_ns - first.monotonic_ns == pytest.approx(1e9, abs=1e3)
