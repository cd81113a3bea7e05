"""A failing scan or a bug escaping it never silences the monitor or the relay: logged with
its traceback, counted, said in status.json, the thread goes on with a bounded back-off."""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rankguard.cli.status_render import render_status
from rankguard.launcher.console import status_line
from rankguard.monitor import monitor as monitor_mod
from rankguard.monitor.monitor import JobMonitor
from rankguard.monitor.rules import RankState
from rankguard.relay import relay as relay_mod
from rankguard.relay.relay import StoreRelay
from rankguard.schema.findings import Finding
from tests.factories import DictStore, heartbeat_config, publisher_record, read_status
from tests.factories import write_heartbeats as write

RUN = "run-thread-errors"
rec = partial(publisher_record, run_id=RUN)


class Flaky:
    """An evaluator that raises for its first ``fails`` calls (a bug in a scan)."""

    name = "flaky"

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0

    def evaluate(self, now: float, ranks: dict[int, RankState]) -> list[Finding]:
        self.calls += 1
        if self.calls <= self.fails:
            raise ValueError(f"bug number {self.calls}")
        return []

    def status(self) -> dict[str, Any]:
        return {"calls": self.calls}


class EscapingScan(JobMonitor):
    """``scan_once`` raises in the monitor thread itself (a bug its guard does not catch)
    for the first ``fails`` calls; the time of each call is kept, and when the handling of
    each failure (its log line, its status.json with an fsync) was done."""

    def __init__(self, *args: Any, fails: int, error: type[BaseException], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fails = fails
        self.error = error
        self.calls: list[float] = []
        self.handled: list[float] = []

    def _scan_failed(self, exc: BaseException, *, thread: bool = False) -> None:
        super()._scan_failed(exc, thread=thread)
        if thread:
            self.handled.append(time.monotonic())

    def scan_once(self) -> list[Finding]:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.fails:
            raise self.error(f"escaped {len(self.calls)}")
        return super().scan_once()


def _monitor(run_dir: Path, cls: type[JobMonitor] = JobMonitor, **kw: Any) -> Any:
    return cls(heartbeat_config(scan_interval_s=0.05), run_dir, RUN, expected_world_size=1, **kw)


def _wait(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_failing_scan_is_logged_counted_and_in_the_status_then_scanning_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, rec(0, 0, world_size=1))
    flaky = Flaky(fails=3)
    mon = _monitor(tmp_path, evaluators=[flaky], check_pids=False)
    with caplog.at_level(logging.ERROR, logger="rankguard.monitor.monitor"):
        mon.scan_once()
    status = read_status(tmp_path)  # written at once, though the scan built nothing
    assert status["monitor"]["state"] == "failing"
    assert status["monitor"]["errors"] == 1
    assert "ValueError: bug number 1" in status["monitor"]["last_error"]
    failed = [r for r in caplog.records if "SCAN FAILED" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # with the traceback
    assert "MONITOR FAILING" in status_line(status)
    assert "MONITOR FAILING: 1 failed scan(s)" in render_status(status, [])

    mon.start()
    try:
        _wait(lambda: flaky.calls > 3 and mon.state == "scanning")
        _wait(lambda: read_status(tmp_path)["monitor"]["state"] == "scanning")
    finally:
        mon.stop()
    status = read_status(tmp_path)
    assert status["monitor"]["errors"] == 3
    assert status["monitor"]["consecutive_errors"] == 0
    assert "bug number 3" in status["monitor"]["last_error"]  # kept after recovery
    assert status["flaky"]["calls"] >= 4
    assert status_line(status).endswith("findings 0")
    assert "MONITOR" not in render_status(status, [])


def test_a_bug_escaping_the_scan_does_not_kill_the_thread_and_backs_off_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(monitor_mod, "MAX_BACKOFF_S", 0.4)
    write(tmp_path, rec(0, 0, world_size=1))
    mon = _monitor(tmp_path, EscapingScan, fails=6, error=RuntimeError, check_pids=False)
    mon.start()
    try:
        _wait(lambda: len(mon.calls) >= 8)
        assert mon._thread is not None and mon._thread.is_alive()
        _wait(lambda: mon.state == "scanning")
    finally:
        mon.stop()
    gaps = [mon.calls[i + 1] - mon.calls[i] for i in range(7)]
    # the back-off itself: from a failure handled to the next scan (the handling's own
    # I/O, an fsync on a loaded disk, is not the back-off)
    waits = [mon.calls[i + 1] - mon.handled[i] for i in range(6)]
    # 0.05 s scans: waits of 0.1, 0.2, 0.4 then capped at 0.4 (plus scheduling noise)
    assert waits[0] >= 0.09 and waits[2] >= 0.35
    assert gaps[0] >= 0.09 and gaps[2] >= 0.35
    assert max(waits) < 0.4 + 0.5
    assert gaps[6] < 0.3  # back to the scan interval once a scan succeeded
    status = read_status(tmp_path)
    assert status["monitor"]["errors"] == 6
    assert "monitor thread: RuntimeError: escaped 6" in status["monitor"]["last_error"]
    assert status["summary"]["ranks_observed"] == 1


class ThreadKilled(BaseException):
    pass


def test_a_monitor_thread_that_ends_says_stopped_in_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    mon = _monitor(tmp_path, EscapingScan, fails=1, error=ThreadKilled, check_pids=False)
    with caplog.at_level(logging.ERROR, logger="rankguard.monitor.monitor"):
        mon.start()
        assert mon._thread is not None
        mon._thread.join(timeout=10)
    assert not mon._thread.is_alive()
    status = read_status(tmp_path)
    assert status["monitor"]["state"] == "stopped"
    assert "ThreadKilled: escaped 1" in status["monitor"]["last_error"]
    assert "MONITOR STOPPED" in status_line(status)
    assert "MONITOR STOPPED" in render_status(status, [])
    assert any(r.exc_info for r in caplog.records if "SCAN FAILED" in r.getMessage())
    assert seen and seen[0].exc_type is ThreadKilled


class EscapingPush(StoreRelay):
    def __init__(self, *args: Any, fails: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fails = fails
        self.calls = 0

    def push_once(self) -> None:
        self.calls += 1
        if self.calls <= self.fails:
            raise RuntimeError(f"push bug {self.calls}")
        super().push_once()


def test_a_bug_escaping_a_relay_push_is_logged_and_the_relay_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(relay_mod, "MAX_BACKOFF_S", 0.2)
    store = DictStore()
    write(tmp_path, rec(2, 0, world_size=4, node_rank=1))
    relay = EscapingPush(store, tmp_path, RUN, 1, 0.05, fails=3)
    with caplog.at_level(logging.ERROR, logger="rankguard.relay.relay"):
        relay.start()
        try:
            _wait(lambda: relay.pushes >= 1)
        finally:
            relay.stop()
    assert relay._thread is not None and not relay._thread.is_alive()
    assert relay.stopped is None
    assert relay.errors == 3 and relay.last_error == "RuntimeError: push bug 3"
    assert any(r.exc_info for r in caplog.records if "PUSH FAILED" in r.getMessage())
    assert relay.keys.heartbeats(1) in store.data
