"""A forged heartbeat line claiming a huge world cannot exhaust node 0's monitor."""

from __future__ import annotations

import json
import logging
import time
import tracemalloc
from functools import partial
from pathlib import Path

import pytest

from rankguard.monitor.monitor import JobMonitor
from rankguard.schema.layout import FINDINGS_FILE
from tests.factories import FakeClock, heartbeat_config, publisher_record, read_status
from tests.factories import write_heartbeats as write

RUN = "run-bounds"
rec = partial(publisher_record, run_id=RUN)


def _monitor(run_dir: Path, clock: FakeClock, **kw: object) -> JobMonitor:
    return JobMonitor(
        heartbeat_config(scan_interval_s=0.05),
        run_dir,
        RUN,
        expected_world_size=None,  # elastic: the world size is learnt from the records
        check_pids=False,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


def _scan(mon: JobMonitor) -> tuple[float, int]:
    tracemalloc.start()
    t0 = time.perf_counter()
    mon.scan_once()
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return elapsed, peak


def test_forged_world_size_is_refused_within_the_rendezvous_bound(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, max_world_size=4)
    write(tmp_path, rec(0, 0, world_size=2), rec(1, 0, world_size=2))
    write(tmp_path, rec(3, 0, world_size=200_000, pid=777))
    mon.scan_once()
    clock.t += 30  # past the initial timeout
    elapsed, peak = _scan(mon)
    assert mon.rules.world_size() == 2
    assert mon.rules.ignored_records >= 1
    assert elapsed < 2.0 and peak < 32 << 20, (elapsed, peak)
    assert [r["rank"] for r in read_status(tmp_path)["ranks"]] == [0, 1]


def test_huge_world_size_without_a_bound_gives_one_finding(tmp_path: Path) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock)
    write(tmp_path, rec(0, 0, world_size=200_000))
    mon.scan_once()
    clock.t += 30
    elapsed, _ = _scan(mon)
    assert elapsed < 10.0, elapsed
    lines = (tmp_path / FINDINGS_FILE).read_text(encoding="utf-8").splitlines()
    never = [json.loads(x) for x in lines if "never_observed" in x]
    assert len(never) == 1 and never[0]["never_seen_count"] == 199_999


def test_a_hostname_with_terminal_escapes_is_logged_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    mon = _monitor(tmp_path, clock, max_world_size=1)
    write(tmp_path, rec(0, 0, world_size=1, hostname="evil\x1b]0;owned\x07\x1b[2J"))
    mon.scan_once()
    clock.t += 30
    with caplog.at_level(logging.WARNING, logger="rankguard.monitor.monitor"):
        mon.scan_once()
    logged = [r.getMessage() for r in caplog.records if "rankguard finding" in r.getMessage()]
    assert logged and all("\x1b" not in m and "\x07" not in m for m in logged)
    assert "\\x1b" in logged[0]
